package callsig

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// testNow is the daemon's clock in tests unless a test moves it.
var testNow = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

const (
	testNS     = "fleet-ns"
	testCLI    = "nodetrust-cli"
	testInst   = "inst-7f3a"
	testKeyExp = "fleet-ns/@daemon/nodetrust-cli/robot_leases/v1/acquire"
)

// clock is a settable clock for Signers and Verifiers.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testKey derives an Ed25519 key from a name, so tests are reproducible.
func testKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("callsig test key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

// counterReader yields distinct 16-byte nonces: a prefix byte and a counter.
type counterReader struct {
	mu     sync.Mutex
	prefix byte
	n      uint64
}

func (r *counterReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range p {
		p[i] = 0
	}
	r.n++
	p[0] = r.prefix
	for i := 0; i < 8 && 1+i < len(p); i++ {
		p[1+i] = byte(r.n >> (8 * i))
	}
	return len(p), nil
}

func newTestSigner(tb testing.TB, sender string, key ed25519.PrivateKey, now func() time.Time) *Signer {
	tb.Helper()
	s, err := NewSigner(SignerConfig{Sender: sender, Key: key, Now: now, Rand: &counterReader{prefix: sender[0]}})
	if err != nil {
		tb.Fatalf("NewSigner: %v", err)
	}
	return s
}

func newTestVerifier(tb testing.TB, keys KeyStore, now func() time.Time, maxEntries int) *Verifier {
	tb.Helper()
	v, err := NewVerifier(VerifierConfig{Namespace: testNS, Keys: keys, Now: now, MaxReplayEntries: maxEntries})
	if err != nil {
		tb.Fatalf("NewVerifier: %v", err)
	}
	return v
}

func mustSign(tb testing.TB, s *Signer, payload string) *Envelope {
	tb.Helper()
	e, err := s.Sign(testNS, testKeyExp, KindQuery, []byte(payload))
	if err != nil {
		tb.Fatalf("Sign: %v", err)
	}
	return e
}

func mustMarshal(tb testing.TB, e *Envelope) []byte {
	tb.Helper()
	b, err := e.MarshalBinary()
	if err != nil {
		tb.Fatalf("MarshalBinary: %v", err)
	}
	return b
}

// wantRejection fails unless err is a *Rejection for check whose message
// contains substr, and whose Error() is "rejected: " + the message.
func wantRejection(tb testing.TB, err error, check, substr string) {
	tb.Helper()
	var r *Rejection
	if !errors.As(err, &r) {
		tb.Fatalf("got %v (%T), want a *Rejection for %q", err, err, check)
	}
	if r.Check != check {
		tb.Errorf("check is %q, want %q (message %q)", r.Check, check, r.Msg)
	}
	if !strings.HasPrefix(r.Msg, check+": ") {
		tb.Errorf("message %q does not start with the check %q", r.Msg, check)
	}
	if r.Error() != "rejected: "+r.Msg {
		tb.Errorf("Error() is %q, want %q", r.Error(), "rejected: "+r.Msg)
	}
	if !strings.Contains(r.Msg, substr) {
		tb.Errorf("message %q does not contain %q", r.Msg, substr)
	}
}

// wantMalformed fails unless err wraps ErrMalformed and contains substr.
func wantMalformed(tb testing.TB, err error, substr string) {
	tb.Helper()
	if err == nil {
		tb.Fatalf("got no error, want one containing %q", substr)
	}
	if !errors.Is(err, ErrMalformed) {
		tb.Errorf("error %q does not wrap ErrMalformed", err)
	}
	if !strings.Contains(err.Error(), substr) {
		tb.Errorf("error %q does not contain %q", err, substr)
	}
}

func cloneEnvelope(e *Envelope) *Envelope {
	c := *e
	c.Payload = bytes.Clone(e.Payload)
	c.Signature = bytes.Clone(e.Signature)
	return &c
}
