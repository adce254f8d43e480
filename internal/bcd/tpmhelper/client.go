package tpmhelper

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// ClientConfig configures [DialConfig].
type ClientConfig struct {
	// Socket is the path of bcd helper's unix socket.
	Socket string
	// Timeout bounds each call, reconnecting included. 0 means
	// DefaultTimeout (30 seconds).
	Timeout time.Duration
}

// Client calls bcd helper's TPM operations and checks every answer (see
// the package documentation). It implements agent.TPM. Its methods are safe for
// concurrent use; calls are sent one at a time on one connection, which is
// made again when it breaks (bcd helper restarted, say).
type Client struct {
	socket  string
	timeout time.Duration
	// lock is held by the call using conn; a channel so that waiting for
	// it honours the call's deadline.
	lock   chan struct{}
	conn   *net.UnixConn // nil when not connected; guarded by lock
	closed bool          // guarded by lock
}

// Dial connects to bcd helper at socketPath, with the default timeout.
// A helper that refuses this process's uid makes it return an error
// wrapping [ErrDenied].
func Dial(socketPath string) (*Client, error) {
	return DialConfig(ClientConfig{Socket: socketPath})
}

// DialConfig is [Dial] with a config.
func DialConfig(cfg ClientConfig) (*Client, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	c := &Client{socket: cfg.Socket, timeout: cfg.Timeout, lock: make(chan struct{}, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	conn, err := c.connect(ctx)
	if err != nil {
		if cerr := ctxErr(ctx, "connect to "+c.socket, err); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	c.conn = conn
	return c, nil
}

// Close closes the connection. Keys the helper holds for this client stay
// loaded until released or evicted: Close them first.
func (c *Client) Close() error {
	c.lock <- struct{}{}
	defer func() { <-c.lock }()
	c.closed = true
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// connect dials the helper and reads its greeting.
func (c *Client) connect(ctx context.Context) (*net.UnixConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		hint := ""
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			hint = " (is bcd-helper.service running?)"
		}
		return nil, fmt.Errorf("connect to bcd helper at %s: %w%s", c.socket, err, hint)
	}
	conn := nc.(*net.UnixConn)
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	var g greeting
	if err := readFrame(conn, maxResponseFrame, &g); err != nil {
		conn.Close()
		return nil, fmt.Errorf("read bcd helper's greeting at %s: %w", c.socket, err)
	}
	if g.Code != "" {
		conn.Close()
		return nil, &HelperError{Op: "connect to " + c.socket, Code: g.Code, Message: g.Error}
	}
	if g.Version != protocolVersion {
		conn.Close()
		return nil, fmt.Errorf("bcd helper at %s speaks protocol version %d, this bcd %d: restart bcd-helper.service after an upgrade", c.socket, g.Version, protocolVersion)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// ctxErr is the error of a call that failed with err once ctx was done, or
// nil when neither ctx nor err says so. The connection's deadline is the
// context's, and may pass a moment before the context says so.
func ctxErr(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded), ctx.Err() == nil && errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%s: %w: %w", op, ErrTimeout, context.DeadlineExceeded)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
	return nil
}

// call sends req and returns the helper's answer, or a *HelperError for a
// failure it answered with. A reused connection that turns out broken
// before any answer is made again once.
func (c *Client) call(ctx context.Context, req *request) (*response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	select {
	case c.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, ctxErr(ctx, req.Op, nil)
	}
	defer func() { <-c.lock }()
	if c.closed {
		return nil, fmt.Errorf("%s: %w", req.Op, ErrClosed)
	}
	for attempt := 0; ; attempt++ {
		reused := c.conn != nil
		if c.conn == nil {
			conn, err := c.connect(ctx)
			if err != nil {
				if cerr := ctxErr(ctx, req.Op, err); cerr != nil {
					return nil, cerr
				}
				return nil, fmt.Errorf("%s: %w", req.Op, err)
			}
			c.conn = conn
		}
		resp, err := roundTrip(ctx, c.conn, req)
		if err == nil {
			if resp.Code != "" {
				return nil, &HelperError{Op: req.Op, Code: resp.Code, Message: resp.Error}
			}
			return resp, nil
		}
		c.conn.Close()
		c.conn = nil
		if cerr := ctxErr(ctx, req.Op, err); cerr != nil {
			return nil, cerr
		}
		if reused && attempt == 0 && brokenConn(err) {
			continue
		}
		return nil, fmt.Errorf("%s: bcd helper at %s: %w", req.Op, c.socket, err)
	}
}

// brokenConn reports whether err says the helper closed the connection.
func brokenConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// roundTrip writes req and reads the answer, within ctx.
func roundTrip(ctx context.Context, conn *net.UnixConn, req *request) (*response, error) {
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := writeFrame(conn, req); err != nil {
		return nil, err
	}
	var resp response
	if err := readFrame(conn, maxResponseFrame, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// callKeys is call for a request naming keys: when the helper holds one of
// them no more (it restarted, or forgot it), their records are sent again
// and the call is retried once.
func (c *Client) callKeys(ctx context.Context, req *request, keys ...*keyData) (*response, error) {
	resp, err := c.call(ctx, req)
	if !errors.Is(err, ErrUnknownKey) {
		return resp, err
	}
	for _, kd := range keys {
		// kd.rec names the key: the helper must derive exactly it again.
		if _, err := c.derive(ctx, kd.rec); err != nil {
			return nil, fmt.Errorf("%s: derive the key again: %w", req.Op, err)
		}
	}
	return c.call(ctx, req)
}

// derive asks the helper for the key of rec and checks its answer.
func (c *Client) derive(ctx context.Context, rec tpm.KeyRecord) (*keyData, error) {
	op := opNodeKey
	if rec.Kind == tpm.KindAK {
		op = opAK
	}
	pem, err := tpm.MarshalKeyRecord(rec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	resp, err := c.call(ctx, &request{Op: op, Record: pem})
	if err != nil {
		return nil, err
	}
	kd, err := checkDerived(op, rec, resp)
	if err != nil {
		// Whatever the helper loaded for this record is of no use.
		_, _ = c.call(ctx, &request{Op: opRelease, Unique: rec.Unique()})
		return nil, err
	}
	return kd, nil
}

// newRecord makes a record of kind under the owner hierarchy with a unique
// of the node's own randomness, as package tpm does.
func newRecord(kind tpm.KeyKind) (tpm.KeyRecord, error) {
	unique := make([]byte, tpm.UniqueSize)
	if _, err := rand.Read(unique); err != nil {
		return tpm.KeyRecord{}, err
	}
	tmpl := tpmpub.NodeKeyTemplate(unique)
	if kind == tpm.KindAK {
		tmpl = tpmpub.AKTemplate(unique)
	}
	return tpm.KeyRecord{Kind: kind, Hierarchy: uint32(tpm2.TPMRHOwner), Template: tpm2.Marshal(tmpl)}, nil
}

// NewNodeKey makes a new node key in the helper's TPM: the client makes the
// record (a fresh unique) and the helper derives it. The answer is checked:
// the key has exactly the node key's attributes, and its name is computed
// here. Store the record to load the key later. The NodeKey is a *Key.
func (c *Client) NewNodeKey(ctx context.Context) (tpm.NodeKey, tpm.KeyRecord, error) {
	rec, err := newRecord(tpm.KindNodeKey)
	if err != nil {
		return nil, tpm.KeyRecord{}, err
	}
	kd, err := c.derive(ctx, rec)
	if err != nil {
		return nil, tpm.KeyRecord{}, err
	}
	return &Key{c: c, kd: kd}, kd.rec, nil
}

// LoadNodeKey derives the node key of rec in the helper's TPM. When rec
// names a key and the TPM derives another, the error wraps
// [tpm.ErrKeyChanged]. The NodeKey is a *Key.
func (c *Client) LoadNodeKey(ctx context.Context, rec tpm.KeyRecord) (tpm.NodeKey, error) {
	if rec.Kind != tpm.KindNodeKey || rec.Unique() == nil {
		return nil, fmt.Errorf("%s: not a valid node key record", opNodeKey)
	}
	kd, err := c.derive(ctx, rec)
	if err != nil {
		return nil, err
	}
	return &Key{c: c, kd: kd}, nil
}

// NewAK makes a new AK in the helper's TPM, as NewNodeKey does for the
// node key. The AttestationKey is an *AK.
func (c *Client) NewAK(ctx context.Context) (tpm.AttestationKey, tpm.KeyRecord, error) {
	rec, err := newRecord(tpm.KindAK)
	if err != nil {
		return nil, tpm.KeyRecord{}, err
	}
	kd, err := c.derive(ctx, rec)
	if err != nil {
		return nil, tpm.KeyRecord{}, err
	}
	return &AK{c: c, kd: kd}, kd.rec, nil
}

// LoadAK derives the AK of rec in the helper's TPM; see LoadNodeKey. The
// AttestationKey is an *AK.
func (c *Client) LoadAK(ctx context.Context, rec tpm.KeyRecord) (tpm.AttestationKey, error) {
	if rec.Kind != tpm.KindAK || rec.Unique() == nil {
		return nil, fmt.Errorf("%s: not a valid AK record", opAK)
	}
	kd, err := c.derive(ctx, rec)
	if err != nil {
		return nil, err
	}
	return &AK{c: c, kd: kd}, nil
}

// Certify has ak certify key over qualifyingData (the node sends
// sha256(csr)) with TPM2_Certify, as [tpm.TPM.Certify] does. ak and key must
// come from this client. The answer is checked: signed by the AK the helper
// announced when ak was derived (else "the helper certified with another
// AK"), a certification the TPM generated, naming key, over qualifyingData.
func (c *Client) Certify(ctx context.Context, ak tpm.AttestationKey, key tpm.NodeKey, qualifyingData []byte) (attest, signature []byte, err error) {
	a, err := c.ownAK(opCertify, ak)
	if err != nil {
		return nil, nil, err
	}
	k, ok := key.(*Key)
	if !ok || k.c != c {
		return nil, nil, fmt.Errorf("%s: the key is not held by this helper", opCertify)
	}
	if k.closed.Load() {
		return nil, nil, fmt.Errorf("%s: the key: %w", opCertify, ErrClosed)
	}
	resp, err := c.callKeys(ctx, &request{Op: opCertify, AK: a.kd.unique, Unique: k.kd.unique, QualifyingData: qualifyingData}, a.kd, k.kd)
	if err != nil {
		return nil, nil, err
	}
	if err := checkCertify(a.kd.pub, k.kd.name, qualifyingData, resp.Attest, resp.Signature); err != nil {
		return nil, nil, untrusted(opCertify, err)
	}
	return resp.Attest, resp.Signature, nil
}

func (c *Client) ownAK(op string, ak tpm.AttestationKey) (*AK, error) {
	a, ok := ak.(*AK)
	if !ok || a.c != c {
		return nil, fmt.Errorf("%s: the AK is not held by this helper", op)
	}
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: the AK: %w", op, ErrClosed)
	}
	return a, nil
}

// EKCertificates returns the EK certificates the helper's TPM holds, keyed
// by NV index, as [tpm.TPM.EKCertificates] does. Only the EK
// certificate indices are accepted; the certificates themselves are the
// verifier's to check.
func (c *Client) EKCertificates(ctx context.Context) (map[uint32][]byte, error) {
	resp, err := c.call(ctx, &request{Op: opEK})
	if err != nil {
		return nil, err
	}
	if err := checkCertificates(resp.Certificates); err != nil {
		return nil, untrusted(opEK, err)
	}
	if resp.Certificates == nil {
		return map[uint32][]byte{}, nil
	}
	return resp.Certificates, nil
}

func checkCertificates(certs map[uint32][]byte) error {
	for idx, der := range certs {
		if _, ok := tpm.EKKindOfIndex(idx); !ok && !tpm.IsEKChainIndex(idx) {
			return fmt.Errorf("a certificate at NV index %#x, which holds no EK certificate", idx)
		}
		if len(der) == 0 {
			return fmt.Errorf("an empty certificate at NV index %#x", idx)
		}
	}
	return nil
}

// EK returns the public part of the helper's TPM's EK of kind, as
// [tpm.TPM.EK] does; the client checks the public area is of that kind and
// computes its name and key itself.
func (c *Client) EK(ctx context.Context, kind tpm.EKKind) (*tpm.EK, error) {
	name, err := ekKindName(kind)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opEK, err)
	}
	resp, err := c.call(ctx, &request{Op: opEK, EKKind: name})
	if err != nil {
		return nil, err
	}
	got, err := parseEKKind(resp.EKKind)
	if err != nil || got == tpm.EKAuto || (kind != tpm.EKAuto && got != kind) {
		return nil, untrusted(opEK, fmt.Errorf("the helper answered with an EK of kind %q for %s", resp.EKKind, kind))
	}
	if err := checkCertificates(resp.Certificates); err != nil {
		return nil, untrusted(opEK, err)
	}
	pub, ekName, err := ekPublic(got, resp.PublicArea)
	if err != nil {
		return nil, untrusted(opEK, fmt.Errorf("the helper's %s EK: %w", got, err))
	}
	return &tpm.EK{Kind: got, Public: pub, PublicArea: resp.PublicArea, Name: ekName}, nil
}

// ActivateCredential has the helper's TPM recover the secret a verifier
// sealed to ek and ak's name, as [tpm.TPM.ActivateCredential] does. ak must
// come from this client and ek from [Client.EK]. The secret cannot be
// checked here: the verifier that made the credential checks it.
func (c *Client) ActivateCredential(ctx context.Context, ak tpm.AttestationKey, ek *tpm.EK, credentialBlob, encryptedSecret []byte) ([]byte, error) {
	a, err := c.ownAK(opActivate, ak)
	if err != nil {
		return nil, err
	}
	if ek == nil {
		return nil, fmt.Errorf("%s: want an EK from EK", opActivate)
	}
	kind, err := ekKindName(ek.Kind)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opActivate, err)
	}
	resp, err := c.callKeys(ctx, &request{
		Op: opActivate, AK: a.kd.unique, EKKind: kind, EKName: ek.Name,
		CredentialBlob: credentialBlob, EncryptedSec: encryptedSecret,
	}, a.kd)
	if err != nil {
		return nil, err
	}
	if len(resp.Secret) == 0 {
		return nil, untrusted(opActivate, errors.New("the helper returned no secret"))
	}
	return resp.Secret, nil
}

// Quote has ak quote pcrs of the SHA-256 bank over nonce, as [tpm.TPM.Quote]
// does. The answer is checked: signed by ak (else "the helper quoted with
// another AK"), a quote the TPM generated over nonce and exactly pcrs, whose
// digest is that of the values returned.
func (c *Client) Quote(ctx context.Context, ak tpm.AttestationKey, nonce []byte, pcrs []int) (quoted, signature []byte, values map[int][]byte, err error) {
	a, err := c.ownAK(opQuote, ak)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := checkPCRs(pcrs); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", opQuote, err)
	}
	resp, err := c.callKeys(ctx, &request{Op: opQuote, AK: a.kd.unique, Nonce: nonce, PCRs: pcrs}, a.kd)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := checkQuote(a.kd.pub, nonce, pcrs, resp.Quoted, resp.Signature, resp.PCRValues); err != nil {
		return nil, nil, nil, untrusted(opQuote, err)
	}
	return resp.Quoted, resp.Signature, resp.PCRValues, nil
}

// release asks the helper to flush the key of kd.
func (c *Client) release(kd *keyData) error {
	_, err := c.call(context.Background(), &request{Op: opRelease, Unique: kd.unique})
	return err
}

// Key is a node key held in bcd helper's TPM: an ECDSA P-256
// crypto.Signer whose every signature is checked against its public half.
// It implements [NodeKey], as *tpm.Key does.
type Key struct {
	c      *Client
	kd     *keyData
	closed atomic.Bool
}

var _ tpm.NodeKey = (*Key)(nil)

// Public returns the key's *ecdsa.PublicKey, from the public area the client
// checked.
func (k *Key) Public() crypto.PublicKey { return k.kd.pub }

// Name returns the key's TPM name, computed by the client from its public
// area.
func (k *Key) Name() []byte { return clone(k.kd.name) }

// PublicArea returns the key's TPMT_PUBLIC.
func (k *Key) PublicArea() []byte { return clone(k.kd.publicArea) }

// Record returns the key's record, naming this key.
func (k *Key) Record() tpm.KeyRecord { return k.kd.rec }

// Sign signs digest, a SHA-256 digest (opts.HashFunc() must be
// crypto.SHA256), with tpm.sign and returns an ASN.1 DER ECDSA signature, as
// *tpm.Key does. rand is not used. A signature that does not verify with
// the key's public half is an error wrapping [ErrUntrustedAnswer] ("the
// helper's signature is not the node key's").
func (k *Key) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if opts == nil || opts.HashFunc() != crypto.SHA256 {
		return nil, errors.New("tpmhelper: the node key signs SHA-256 digests only")
	}
	return k.SignContext(context.Background(), digest)
}

// SignContext is [Key.Sign] with a context.
func (k *Key) SignContext(ctx context.Context, digest []byte) ([]byte, error) {
	if len(digest) != sha256.Size {
		return nil, fmt.Errorf("tpmhelper: digest of %d bytes, want a SHA-256 digest", len(digest))
	}
	if k.closed.Load() {
		return nil, fmt.Errorf("%s: the node key: %w", opSign, ErrClosed)
	}
	resp, err := k.c.callKeys(ctx, &request{Op: opSign, Unique: k.kd.unique, Digest: digest}, k.kd)
	if err != nil {
		return nil, err
	}
	if !ecdsa.VerifyASN1(k.kd.pub, digest, resp.Signature) {
		return nil, untrusted(opSign, errNotNodeKeySignature)
	}
	return resp.Signature, nil
}

// Close releases the key (tpm.release): the helper flushes it. Closing twice
// is a no-op.
func (k *Key) Close() error {
	if k.closed.Swap(true) {
		return nil
	}
	return k.c.release(k.kd)
}

// AK is an attestation key held in bcd helper's TPM. It implements
// [AttestationKey], as *tpm.AK does.
type AK struct {
	c      *Client
	kd     *keyData
	closed atomic.Bool
}

var _ tpm.AttestationKey = (*AK)(nil)

// Public returns the AK's *ecdsa.PublicKey, from the public area the helper
// announced and the client checked. Certifications and quotes must verify
// with it.
func (a *AK) Public() crypto.PublicKey { return a.kd.pub }

// Name returns the AK's TPM name, computed by the client.
func (a *AK) Name() []byte { return clone(a.kd.name) }

// PublicArea returns the AK's TPMT_PUBLIC.
func (a *AK) PublicArea() []byte { return clone(a.kd.publicArea) }

// Record returns the AK's record, naming this AK.
func (a *AK) Record() tpm.KeyRecord { return a.kd.rec }

// Close releases the AK (tpm.release). Closing twice is a no-op.
func (a *AK) Close() error {
	if a.closed.Swap(true) {
		return nil
	}
	return a.c.release(a.kd)
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }
