package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/tpm"
)

// ErrJoinRefused is the control plane's refusal of a join; the reason is
// known only to the server.
var ErrJoinRefused = errors.New("the control plane refused the join (Join refused); ask its operator for a fresh token, and check its log for the reason")

// ErrOtherNode means the machine is already joined as another node than
// the one asked for.
var ErrOtherNode = errors.New("already joined as another node")

// JoinConfig is what a join needs.
type JoinConfig struct {
	// Servers are the control plane's addresses; the join moves to
	// another when one is down.
	Servers    []string
	ServerName string
	Pins       config.Pins
	// JWK is the join encryption key (join-encryption.jwk); nil takes it
	// from the control plane's well-known document, checked against the
	// pins.
	JWK     []byte
	DataDir string
	Role    string
	NodeID  string
	// Token returns the join credential. It is called only once the
	// machine is known not to be joined. For the tpm attestor it may
	// return nil: a machine the control plane knows by its EK needs none.
	Token func() ([]byte, error)
	// Attestor is "token" (default) or "tpm".
	Attestor string
	// TPM is the host's TPM: node keys are made in it when set, and the
	// tpm attestor needs it.
	TPM TPM
	// EventLog is the boot's measurement log the tpm attestor sends with
	// its quote (the host's /sys/kernel/security/tpm0/binary_bios_measurements);
	// nil for a TPM without one.
	EventLog []byte
	Claims   hwclaims.Claims
	Version  string
	Logger   *slog.Logger

	// MaxAttempts bounds retries of retryable failures (default 20);
	// BackoffMin and BackoffMax bound the wait between them.
	MaxAttempts int
	BackoffMin  time.Duration
	BackoffMax  time.Duration
	Now         func() time.Time
	// Record, when set, is given the verified answer before the identity
	// is stored; an error fails the join and leaves no identity. Under
	// [helper], root keeps it as the host's join record.
	Record func(*joinv1.SignedJoinResult) error
	// Waiting, when set, is told each time the join waits for an owner's
	// approval, so the user sees why nothing happens.
	Waiting func(message string, next time.Duration)
	// Sleep waits between attempts; default: a timer that ends early when
	// ctx is done. Tests record the waits through it.
	Sleep func(ctx context.Context, d time.Duration) error

	// pinErr reports a failed server identity check, which no retry mends.
	pinErr func() error
	// endpoints are the connection's addresses; the well-known document
	// may add more.
	endpoints *Endpoints
}

// JoinResult tells what Join did.
type JoinResult struct {
	State *identity.State
	// Already is true when the machine was already joined and nothing
	// was sent.
	Already bool
}

func (c *JoinConfig) defaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 20
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 500 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
}

// Join creates the node's identity (seed 000, "What the join does"). On a
// machine whose identity loads it sends nothing and reads no credential.
func Join(ctx context.Context, c JoinConfig) (*JoinResult, error) {
	c.defaults()
	keys := Keys{TPM: c.TPM}
	st, err := identity.LoadState(c.DataDir, identity.LoadOptions{KeyLoader: keys.Loader(ctx), Attestor: c.Attestor})
	switch {
	case err == nil:
		if c.NodeID != "" && c.NodeID != st.Identity.NodeID {
			return nil, fmt.Errorf("%w: this machine is joined as %s, not %s; to join as %s: %s --node-id %s",
				ErrOtherNode, st.Identity.NodeID, c.NodeID, c.NodeID, identity.WayBack(st.Identity.Attestor), c.NodeID)
		}
		return &JoinResult{State: st, Already: true}, nil
	case !errors.Is(err, identity.ErrNotJoined):
		return nil, err
	}

	conn, guard, endpoints, err := Dial(c.Servers, c.ServerName, c.Pins.ServingCA, nil)
	if err != nil {
		return nil, err
	}
	c.endpoints = endpoints
	c.pinErr = guard.Err
	defer conn.Close()
	client := joinv1.NewJoinServiceClient(conn)

	// Step 2's key: from the file beside the config or the well-known
	// document. Fetching the document also proves the serving pin before
	// any credential is read.
	jwk := c.JWK
	if jwk == nil {
		jwk, err = fetchJWK(ctx, client, c)
		if err != nil {
			return nil, err
		}
	}
	encKey, err := pki.ParseJWK(jwk)
	if err != nil {
		return nil, fmt.Errorf("join encryption key: %w", err)
	}
	if encKey.Pin() != c.Pins.JoinEncryption {
		return nil, fmt.Errorf("the join encryption key has pin %s, not join_encryption_key_pin %s; fetch join-encryption.jwk again from the control plane", encKey.Pin(), c.Pins.JoinEncryption)
	}

	// Step 1: the key and the CSR. For a tpm join the key is made in the
	// attestor's own TPM connection, so the AK can certify it.
	attestor := c.Attestor
	if attestor == "" {
		attestor = "token"
	}
	var tj *tpmJoin
	if attestor == "tpm" {
		if c.TPM == nil {
			return nil, errors.New("--attestor tpm needs a TPM: set tpm in config.toml (a device path or tcp://host:port)")
		}
		tj = &tpmJoin{t: c.TPM, eventLog: c.EventLog, now: c.Now}
		// An installed node joins with the LAK its intake certified.
		if tj.lak, err = readLAK(c.DataDir); err != nil {
			return nil, err
		}
		defer tj.close()
	}
	key, keyPEM, keyKind, err := keys.New(ctx)
	if err != nil {
		return nil, err
	}
	if cl, ok := key.(io.Closer); ok {
		defer cl.Close()
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		return nil, err
	}
	csrHash := sha256.Sum256(csr)
	req := &joinv1.JoinRequest{
		Csr:           csr,
		Attestor:      attestor,
		Claims:        claimsProto(c.Claims),
		DaemonVersion: c.Version,
		Role:          c.Role,
		NodeId:        c.NodeID,
	}
	if tj != nil {
		if req.Tpm, err = tj.evidence(ctx, key, csrHash[:]); err != nil {
			return nil, err
		}
	}

	// Step 2: the seal, bound to this CSR.
	token, err := c.Token()
	if err != nil {
		return nil, err
	}
	if token == nil && tj == nil {
		return nil, errors.New("no join token")
	}
	if token != nil {
		req.SealedToken, err = pki.SealToken(encKey, csrHash[:], token)
		clear(token)
		if err != nil {
			return nil, fmt.Errorf("seal the join token: %w", err)
		}
	}

	// Step 3 and the deferral loop of step 4.
	var answer func(context.Context, *joinv1.JoinChallenge) (*joinv1.ChallengeAnswer, error)
	if tj != nil {
		answer = tj.answer
	}
	signed, err := joinRounds(ctx, client, req, c, answer)
	if err != nil {
		return nil, err
	}
	// Step 4: the answer.
	opened, err := joinresponse.Open(signed, joinresponse.Expect{
		SigningKeyPin: c.Pins.JoinSigning,
		CSRSHA256:     csrHash[:],
		PublicKey:     key.Public(),
		NodeID:        c.NodeID,
		Role:          c.Role,
		Now:           c.Now(),
	})
	if err != nil {
		return nil, fmt.Errorf("check the control plane's answer: %w", err)
	}
	r := opened.Result
	var akPEM []byte
	if tj != nil {
		if !bytes.Equal(opened.Info.TPMAKName, tj.ak.Name()) {
			return nil, fmt.Errorf("check the control plane's answer: the certificate names AK %x, not this TPM's AK %x", opened.Info.TPMAKName, tj.ak.Name())
		}
		if akPEM, err = tpm.MarshalKeyRecord(tj.ak.Record()); err != nil {
			return nil, err
		}
	}
	// Step 5: root's record.
	if c.Record != nil {
		if err := c.Record(signed); err != nil {
			return nil, fmt.Errorf("record the join response: %w", err)
		}
	}
	// Step 6: persist.
	id := identity.Identity{
		Version:     1,
		NodeID:      r.NodeId,
		SPIFFEID:    r.SpiffeId,
		TrustDomain: r.TrustDomain,
		Role:        r.Role,
		Site:        r.Site,
		Generation:  r.IdentityGeneration,
		Attestor:    attestor,
		KeyKind:     keyKind,
		TPMAK:       akPEM,
		Chain:       r.Chain,
		Roots:       r.Roots,
		ServerTime:  time.Unix(0, r.ServerTimeUnixNano).UTC(),
		JoinedAt:    c.Now().UTC(),
	}
	if err := identity.Persist(c.DataDir, id, keyPEM, c.Now()); err != nil {
		return nil, fmt.Errorf("store the identity in %s: %w", c.DataDir, err)
	}
	st, err = identity.LoadState(c.DataDir, identity.LoadOptions{KeyLoader: keys.Loader(ctx)})
	if err != nil {
		return nil, fmt.Errorf("load the identity just stored: %w", err)
	}
	return &JoinResult{State: st}, nil
}

// maxDeferralRounds bounds pending and challenge answers for one join.
const maxDeferralRounds = 64

// maxChallengeRounds is the most JoinChallenge rounds a join answers.
const maxChallengeRounds = 3

// joinRounds sends the request, retrying retryable failures with backoff
// (waiting out a server's pushback exactly) and following deferrals.
func joinRounds(ctx context.Context, client joinv1.JoinServiceClient, req *joinv1.JoinRequest, c JoinConfig,
	answer func(context.Context, *joinv1.JoinChallenge) (*joinv1.ChallengeAnswer, error)) (*joinv1.SignedJoinResult, error) {
	for round := 0; round < maxDeferralRounds; round++ {
		resp, err := callWithRetry(ctx, c, func(ctx context.Context, opts ...grpc.CallOption) (*joinv1.JoinResponse, error) {
			return client.Join(ctx, req, opts...)
		})
		if err != nil {
			return nil, err
		}
		switch r := resp.Result.(type) {
		case *joinv1.JoinResponse_Signed:
			return r.Signed, nil
		case *joinv1.JoinResponse_Pending:
			wait := max(time.Duration(r.Pending.RetryAfterMs)*time.Millisecond, time.Second)
			c.Logger.InfoContext(ctx, "join pending: waiting for the control plane's approval", "retry_in", wait.String(), "message", r.Pending.Message)
			if c.Waiting != nil {
				c.Waiting(r.Pending.Message, wait)
			}
			req.DeferralId = r.Pending.DeferralId
			if err := c.Sleep(ctx, wait); err != nil {
				return nil, err
			}
		case *joinv1.JoinResponse_Challenge:
			ch := r.Challenge
			if answer == nil {
				return nil, fmt.Errorf("the control plane sent a challenge, which the %s attestor cannot answer", req.Attestor)
			}
			if ch.Round > maxChallengeRounds {
				return nil, fmt.Errorf("the control plane sent challenge round %d; at most %d are answered", ch.Round, maxChallengeRounds)
			}
			ans, err := answer(ctx, ch)
			if err != nil {
				return nil, fmt.Errorf("answer challenge round %d: %w", ch.Round, err)
			}
			req.DeferralId, req.Answer = ch.DeferralId, ans
		default:
			return nil, errors.New("the control plane sent an empty join response")
		}
	}
	return nil, fmt.Errorf("join still deferred after %d rounds", maxDeferralRounds)
}

// retryable reports whether a failure may go away by itself.
func retryable(code codes.Code) bool {
	switch code {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// callWithRetry calls f up to c.MaxAttempts times.
func callWithRetry[T any](ctx context.Context, c JoinConfig, f func(context.Context, ...grpc.CallOption) (T, error)) (T, error) {
	var zero T
	backoff := c.BackoffMin
	for attempt := 1; ; attempt++ {
		var trailer metadata.MD
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := f(callCtx, grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			return out, nil
		}
		if c.pinErr != nil {
			if perr := c.pinErr(); perr != nil {
				return zero, fmt.Errorf("the control plane at %s is not the one the pins name: %w", strings.Join(c.Servers, ", "), perr)
			}
		}
		st := status.Convert(err)
		if st.Code() == codes.PermissionDenied {
			return zero, ErrJoinRefused
		}
		if !retryable(st.Code()) || attempt >= c.MaxAttempts || ctx.Err() != nil {
			return zero, fmt.Errorf("join (attempt %d of %d): %s", attempt, c.MaxAttempts, describe(st))
		}
		wait, pushed := pushback(trailer)
		if !pushed {
			// Full jitter in [backoff/2, backoff].
			wait = backoff/2 + rand.N(backoff/2+1)
			backoff = min(backoff*2, c.BackoffMax)
		}
		c.Logger.WarnContext(ctx, "join failed, retrying", "attempt", attempt, "retry_in", wait.String(), logkey.Error, describe(st))
		if err := c.Sleep(ctx, wait); err != nil {
			return zero, err
		}
	}
}

// pushback reads the server's grpc-retry-pushback-ms trailer.
func pushback(md metadata.MD) (time.Duration, bool) {
	v := md.Get("grpc-retry-pushback-ms")
	if len(v) == 0 {
		return 0, false
	}
	ms, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || ms < 0 {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// describe says what a failed call's status means to the operator.
// UNAVAILABLE covers a control plane that could not be reached and one that
// answered it cannot serve now (its store or its signing key): the message
// tells which, so the wording names neither.
func describe(st *status.Status) string {
	if st.Code() == codes.Unavailable {
		return "control plane unavailable: " + st.Message()
	}
	return st.Code().String() + ": " + st.Message()
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// fetchJWK reads the well-known document and returns its join encryption
// key after checking that the document's pins are the ones given.
func fetchJWK(ctx context.Context, client joinv1.JoinServiceClient, c JoinConfig) ([]byte, error) {
	pins := c.Pins
	resp, err := callWithRetry(ctx, c,
		func(ctx context.Context, opts ...grpc.CallOption) (*joinv1.GetWellKnownResponse, error) {
			return client.GetWellKnown(ctx, &joinv1.GetWellKnownRequest{}, opts...)
		})
	if err != nil {
		return nil, fmt.Errorf("fetch the well-known document: %w", err)
	}
	var doc pki.WellKnown
	if err := json.Unmarshal(resp.Document, &doc); err != nil {
		return nil, fmt.Errorf("read the well-known document: %w", err)
	}
	for _, p := range []struct {
		name, got string
		want      pki.Pin
	}{
		{"serving_ca_spki_pin", doc.ServingCASPKIPin, pins.ServingCA},
		{"join_signing_key_pin", doc.JoinSigningKeyPin, pins.JoinSigning},
		{"join_encryption_key_pin", doc.JoinEncryptionKeyPin, pins.JoinEncryption},
	} {
		if p.got != p.want.String() {
			return nil, fmt.Errorf("the well-known document's %s is %s, not the pinned %s; check the pins against the control plane's pki-bundle.json", p.name, p.got, p.want)
		}
	}
	if c.endpoints != nil {
		c.endpoints.Add(doc.Servers...)
	}
	if len(doc.JoinEncryptionJWK) == 0 {
		return nil, errors.New("the well-known document has no join_encryption_jwk")
	}
	return doc.JoinEncryptionJWK, nil
}

func claimsProto(c hwclaims.Claims) *joinv1.HardwareClaims {
	return &joinv1.HardwareClaims{
		ProductUuid:   c.ProductUUID,
		ProductSerial: c.ProductSerial,
		BoardSerial:   c.BoardSerial,
		ChassisSerial: c.ChassisSerial,
		Macs:          c.MACs,
		GpuUuids:      c.GPUUUIDs,
		Hostname:      c.Hostname,
		BootId:        c.BootID,
	}
}
