package install

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Pattern is the config endpoint's route on the HTTPS listener.
const Pattern = "GET /v1/config/{uuid}"

// ConfigPath is the path of uuid's config.
func ConfigPath(uuid string) string { return "/v1/config/" + uuid }

// maxAuthorization bounds the Authorization header read.
const maxAuthorization = 256

// storeRetry is the Retry-After of a fetch the store could not answer.
const storeRetry = 5 * time.Second

// Handler serves GET /v1/config/{uuid} (Pattern) with the install code as
// its bearer credential. Mount it on the HTTPS listener whose http.Server
// has ConnContext set to [ConnContext]: without it no response is
// confirmed delivered and no code burns.
func (r *Releaser) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(Pattern, r.serve)
	return mux
}

// fetch is one request's state, for its outcome and log line.
type fetch struct {
	uuid    string
	node    string
	gen     uint64
	outcome string
	detail  string
}

func (r *Releaser) serve(w http.ResponseWriter, req *http.Request) {
	f := &fetch{}
	defer func() {
		r.metrics.fetches.WithLabelValues(f.outcome).Inc()
		r.logFetch(req, f)
		if r.observe != nil {
			r.observe(f.outcome)
		}
	}()
	h := w.Header()
	h.Set("Cache-Control", "no-store")

	uuid, err := NormalizeUUID(req.PathValue("uuid"))
	if err != nil {
		f.outcome, f.detail = OutcomeBadRequest, err.Error()
		http.Error(w, "not a machine UUID", http.StatusBadRequest)
		return
	}
	f.uuid = uuid
	if !emptyBody(w, req) {
		f.outcome, f.detail = OutcomeBadRequest, "a body"
		http.Error(w, "a config fetch has no body", http.StatusBadRequest)
		return
	}
	code, ok := bearer(req)
	if !ok {
		f.outcome, f.detail = OutcomeUnauthorized, "no bearer install code"
		unauthorized(w)
		return
	}

	ctx := req.Context()
	rel, err := r.cfg.Store.GetConfigRelease(ctx, uuid)
	switch {
	case errors.Is(err, store.ErrNotFound):
		// Derive and compare anyway: an unknown UUID takes as long as a
		// wrong code.
		code.verifies(uuid, make([]byte, 32))
		f.outcome, f.detail = OutcomeUnauthorized, "no release for this UUID"
		unauthorized(w)
		return
	case err != nil:
		f.outcome, f.detail = OutcomeStoreError, err.Error()
		unavailable(w)
		return
	}
	f.node, f.gen = rel.NodeID, rel.Generation
	if !code.verifies(uuid, rel.Verifier) {
		f.outcome, f.detail = OutcomeUnauthorized, "wrong code (or an earlier render's)"
		unauthorized(w)
		return
	}
	// The code is right: saying why it no longer works tells nothing new.
	now := r.cfg.Now()
	if r.gone(w, f, rel, now) {
		return
	}
	config, err := code.open(uuid, rel.Sealed)
	if err != nil {
		f.outcome, f.detail = OutcomeStoreError, err.Error()
		http.Error(w, "the stored config does not open with this code; render the config again", http.StatusInternalServerError)
		return
	}
	defer clear(config)

	claim, err := r.claimID()
	if err != nil {
		f.outcome, f.detail = OutcomeStoreError, err.Error()
		unavailable(w)
		return
	}
	err = r.cfg.Store.ClaimConfigRelease(ctx, uuid, rel.Generation, claim, now, now.Add(r.claimFor()))
	switch {
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
		r.refuseClaim(ctx, w, f, code, now)
		return
	case err != nil:
		f.outcome, f.detail = OutcomeStoreError, err.Error()
		unavailable(w)
		return
	}
	r.deliver(w, req, f, rel, claim, config)
}

// gone answers a release whose code no longer works: spent (burned), or
// expired (or purged after its expiry).
func (r *Releaser) gone(w http.ResponseWriter, f *fetch, rel store.ConfigRelease, now time.Time) bool {
	switch {
	case rel.State == store.ReleaseBurned:
		f.outcome = OutcomeSpent
		http.Error(w, "this install code was spent: the config was delivered once; render the config again for a new code", http.StatusGone)
	case !now.Before(rel.ExpiresAt) || len(rel.Sealed) == 0:
		f.outcome = OutcomeExpired
		http.Error(w, "this install code expired; render the config again for a new code", http.StatusGone)
	default:
		return false
	}
	return true
}

// refuseClaim answers a fetch whose claim lost: another fetch holds it, or
// the release changed (burned, re-rendered) since it was read.
func (r *Releaser) refuseClaim(ctx context.Context, w http.ResponseWriter, f *fetch, code Code, now time.Time) {
	rel, err := r.cfg.Store.GetConfigRelease(ctx, f.uuid)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && !code.verifies(f.uuid, rel.Verifier)):
		f.outcome, f.detail = OutcomeUnauthorized, "re-rendered meanwhile"
		unauthorized(w)
	case err != nil:
		f.outcome, f.detail = OutcomeStoreError, err.Error()
		unavailable(w)
	case r.gone(w, f, rel, now):
	default:
		f.outcome = OutcomeBusy
		wait := rel.ClaimedUntil.Sub(now)
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, math.Ceil(wait.Seconds())))))
		http.Error(w, "another fetch is receiving this config; retry after Retry-After seconds", http.StatusConflict)
	}
}

// deliver writes the config whole, waits until the peer acknowledged every
// byte, and burns the code; on any failure it gives the claim back, so a
// retry works until the config expires.
func (r *Releaser) deliver(w http.ResponseWriter, req *http.Request, f *fetch, rel store.ConfigRelease, claim string, config []byte) {
	// The claim is settled even when the client has gone: not with the
	// request's context.
	settle, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), r.claimFor())
	defer cancel()
	unclaim := func(outcome, detail string) {
		f.outcome, f.detail = outcome, detail
		if err := r.cfg.Store.UnclaimConfigRelease(settle, f.uuid, rel.Generation, claim); err != nil {
			f.detail += "; and the claim could not be given back (it lapses by itself): " + err.Error()
		}
	}

	conn := tcpConnOf(req.Context())
	var before counters
	if conn != nil {
		c, err := readCounters(conn)
		if err != nil {
			conn = nil
		}
		before = c
	}
	h := w.Header()
	h.Set("Content-Type", rel.ContentType)
	h.Set("Content-Length", strconv.Itoa(len(config)))
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(r.cfg.WriteTimeout))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(config); err != nil {
		unclaim(OutcomeWriteFailed, err.Error())
		return
	}
	if err := rc.Flush(); err != nil {
		unclaim(OutcomeWriteFailed, err.Error())
		return
	}
	if conn == nil {
		unclaim(OutcomeUnconfirmable, "no TCP connection to ask for the acknowledgement (is ConnContext set?)")
		return
	}
	after, err := readCounters(conn)
	if err != nil {
		unclaim(OutcomeUnconfirmable, err.Error())
		return
	}
	// Everything written up to now, and at least the body after what was
	// written before: an HTTP/2 response may still sit in the server's
	// buffer when Flush returns.
	target := max(after.written(), before.written()+uint64(len(config)))
	if err := waitAcked(settle, conn, target, r.cfg.AckTimeout); err != nil {
		unclaim(OutcomeUnacknowledged, err.Error())
		return
	}
	if err := r.cfg.Store.BurnConfigRelease(settle, f.uuid, rel.Generation, claim, r.cfg.Now()); err != nil {
		f.outcome, f.detail = OutcomeBurnLost, err.Error()
		return
	}
	f.outcome = OutcomeReleased
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Releaser) claimID() (string, error) {
	random := r.cfg.Random
	if random == nil {
		random = rand.Reader
	}
	b := make([]byte, 16)
	if _, err := io.ReadFull(random, b); err != nil {
		return "", fmt.Errorf("claim id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// bodyWait bounds the wait for the end of an HTTP/2 request whose body
// was left open.
const bodyWait = 5 * time.Second

// emptyBody reports whether the request has no body. An HTTP/2 request
// that did not end its stream with its headers (its length unknown) must
// end it without data within bodyWait.
func emptyBody(w http.ResponseWriter, req *http.Request) bool {
	switch {
	case req.ContentLength > 0 || len(req.TransferEncoding) > 0:
		return false
	case req.ContentLength == 0:
		return true
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyWait))
	n, err := io.ReadFull(req.Body, make([]byte, 1))
	return n == 0 && errors.Is(err, io.EOF)
}

// bearer reads the install code of "Authorization: Bearer <code>".
func bearer(req *http.Request) (Code, bool) {
	v := req.Header.Get("Authorization")
	if len(v) > maxAuthorization {
		return Code{}, false
	}
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Code{}, false
	}
	c, err := ParseCode(strings.TrimSpace(token))
	return c, err == nil
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="nodetrust config"`)
	http.Error(w, "install code refused", http.StatusUnauthorized)
}

func unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(int(storeRetry.Seconds())))
	http.Error(w, "the control plane cannot answer now; retry after Retry-After seconds", http.StatusServiceUnavailable)
}

// logFetch logs one fetch: never its code or config.
func (r *Releaser) logFetch(req *http.Request, f *fetch) {
	level := r.log.WarnContext
	switch f.outcome {
	case OutcomeReleased:
		level = r.log.InfoContext
	case OutcomeUnauthorized, OutcomeBadRequest, OutcomeBusy:
		// Hostile or impatient traffic is counted, and logged only at
		// debug level.
		level = r.log.DebugContext
	}
	args := []any{"outcome", f.outcome, "uuid", f.uuid, "peer", req.RemoteAddr}
	if f.node != "" {
		args = append(args, "node", f.node, "generation", f.gen)
	}
	if f.detail != "" {
		args = append(args, "detail", f.detail)
	}
	msg := "config fetch"
	switch f.outcome {
	case OutcomeReleased:
		msg = "config released: install code burned"
	case OutcomeWriteFailed, OutcomeUnacknowledged, OutcomeUnconfirmable:
		msg = "config fetch not confirmed delivered: the install code stays valid for a retry until the config expires"
	case OutcomeBurnLost:
		msg = "config delivered but its claim was lost before the burn: the code stays valid"
	}
	level(req.Context(), msg, args...)
}
