package callsig

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Window is how far a call's timestamp may be from the verifier's clock, in
// the past or in the future; exactly Window away is accepted. It is also how
// long, at least, the verifier remembers a nonce. The machines of a
// federation keep their wall clocks within Window of each other.
const Window = 30 * time.Second

// KeyStore gives a daemon's verifier the public key of each sender it
// knows: the key of each running instance, of the command line and of the
// daemon itself. Key must be safe for concurrent use, and fast: it is called
// once for each call verified.
type KeyStore interface {
	// Key returns the Ed25519 public key of sender, or false when the
	// daemon has none (such as an instance whose process does not run).
	Key(sender string) (ed25519.PublicKey, bool)
}

// KeyMap is a fixed KeyStore. It is safe for concurrent use as long as no
// one writes to it; a daemon whose senders come and go implements KeyStore
// with its own locking.
type KeyMap map[string]ed25519.PublicKey

// Key returns the key of sender in m.
func (m KeyMap) Key(sender string) (ed25519.PublicKey, bool) {
	k, ok := m[sender]
	return k, ok
}

// VerifierConfig configures [NewVerifier].
type VerifierConfig struct {
	// Namespace is the daemon's namespace; calls signed for another are
	// refused. Required.
	Namespace string
	// Keys gives the key of each local sender. Required.
	Keys KeyStore
	// Now is the daemon's clock; nil means time.Now.
	Now func() time.Time
	// Start, when set, is when the daemon's process started: calls signed
	// before it are refused (CheckTimestamp). The replay cache lives in
	// memory, so a restarted daemon does not know the nonces its previous
	// process accepted; with Start set, those calls cannot be replayed to
	// it. The cost: a call signed just before the restart, or by a machine
	// whose clock is behind, is refused until its client signs it again.
	// Zero accepts any call up to Window old.
	Start time.Time
	// MaxReplayEntries caps the nonces the replay cache holds; zero means
	// DefaultMaxReplayEntries. When it is full, calls are refused with
	// CheckReplayCacheFull until entries expire. Each entry costs some 30
	// bytes, and the cache admits about MaxReplayEntries/Window calls a
	// second sustained.
	MaxReplayEntries int
}

// Verifier checks signed calls for one daemon. It is safe for concurrent
// use.
type Verifier struct {
	namespace string
	keys      KeyStore
	now       func() time.Time
	start     int64 // Unix ns; math.MinInt64 when unset
	replay    *replayCache
}

// NewVerifier returns a Verifier for cfg, filling in the default clock and
// replay cache cap.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if cfg.Namespace == "" || len(cfg.Namespace) > MaxNamespaceLen {
		return nil, fmt.Errorf("new verifier: namespace %s is empty or longer than %d bytes", quote(cfg.Namespace), MaxNamespaceLen)
	}
	if cfg.Keys == nil {
		return nil, errors.New("new verifier: no key store")
	}
	if cfg.MaxReplayEntries < 0 {
		return nil, fmt.Errorf("new verifier: MaxReplayEntries is %d, want 0 (the default) or more", cfg.MaxReplayEntries)
	}
	v := &Verifier{namespace: cfg.Namespace, keys: cfg.Keys, now: cfg.Now, start: math.MinInt64}
	if v.now == nil {
		v.now = time.Now
	}
	if !cfg.Start.IsZero() {
		v.start = cfg.Start.UnixNano()
	}
	maxEntries := cfg.MaxReplayEntries
	if maxEntries == 0 {
		maxEntries = DefaultMaxReplayEntries
	}
	v.replay = newReplayCache(maxEntries)
	return v, nil
}

// Verify checks a call from a local client, and returns nil when it may be
// served as coming from env.Sender. Otherwise it returns a [*Rejection]
// naming the first check that failed, in this order:
//
//  1. [CheckNoSignature]: env is nil (the call has no envelope) or has no
//     signature.
//  2. [CheckMalformed]: a field is empty or over its limit, or the
//     signature is not 64 bytes (only for envelopes not made by
//     [Envelope.UnmarshalBinary], which refuses these).
//  3. [CheckUnknownSender]: the key store has no key for env.Sender.
//  4. [CheckSignature]: the signature does not verify with that key.
//  5. [CheckNamespace]: env.Namespace is not the verifier's namespace.
//  6. [CheckTimestamp]: env.Timestamp is more than [Window] away from the
//     verifier's clock, or before VerifierConfig.Start.
//  7. [CheckReplay]: a call accepted in the last Window (or still within
//     its own Window) carried the same nonce.
//  8. [CheckReplayCacheFull]: the replay cache cannot take another nonce.
//
// A call that passes is remembered, so the same envelope is refused the
// next time. Verify does not read env.KeyExpr: the caller checks that it
// is the key expression the call arrived on and that it names this daemon
// as receiver and env.Sender as sender, and checks that env.Kind is the
// call's kind. A daemon that cannot decode a call's envelope refuses it as
// malformed; one that gets no envelope at all calls Verify(nil).
//
// A probe (see [IsProbe]) needs no signature: the daemon answers it
// without calling Verify.
func (v *Verifier) Verify(env *Envelope) error {
	if err := precheck(env); err != nil {
		return err
	}
	key, ok := v.keys.Key(env.Sender)
	if !ok {
		return reject(CheckUnknownSender, "this daemon has no key for sender %s; an instance whose process does not run has none", quote(env.Sender))
	}
	if len(key) != ed25519.PublicKeySize {
		return reject(CheckUnknownSender, "the key this daemon holds for sender %s is %d bytes, not an Ed25519 public key", quote(env.Sender), len(key))
	}
	return v.verify(env, key)
}

// VerifyPeer checks a call from a client of another machine, whose machine
// proof [VerifyMachineProof] has turned into peer. It returns nil when the
// call may be served as coming from peer.Sender of machine peer.NodeID.
// Otherwise it returns a [*Rejection], checking in the order of
// [Verifier.Verify], except that instead of looking up a key it refuses
// with [CheckMachineProof] a nil peer and a call whose env.Sender is not
// peer.Sender, and it verifies the signature with peer.SenderKey. Calls of
// all machines share one replay cache.
func (v *Verifier) VerifyPeer(env *Envelope, peer *Peer) error {
	if err := precheck(env); err != nil {
		return err
	}
	if peer == nil {
		return reject(CheckMachineProof, "a call of another machine needs a machine proof")
	}
	if len(peer.SenderKey) != ed25519.PublicKeySize {
		return reject(CheckMachineProof, "the endorsed key of sender %s is %d bytes, not an Ed25519 public key", quote(peer.Sender), len(peer.SenderKey))
	}
	if env.Sender != peer.Sender {
		return reject(CheckMachineProof, "the call gives sender %s, but its machine proof endorses %s", quote(env.Sender), quote(peer.Sender))
	}
	return v.verify(env, peer.SenderKey)
}

// precheck makes the checks that need no key: a signature is present and
// every field is within the format's limits.
func precheck(env *Envelope) error {
	if env == nil || len(env.Signature) == 0 {
		return reject(CheckNoSignature, "the call carries no signature; a client built before calls were signed must be built again")
	}
	if err := env.check(); err != nil {
		var fe *formatError
		errors.As(err, &fe)
		return rejectCause(err, CheckMalformed, "%s", fe.detail)
	}
	return nil
}

// signedStack is the size of the stack buffer for the signed bytes; longer
// calls use pooled buffers.
const (
	signedStack = 2048
	poolMaxCap  = 64 << 10
)

var signedPool = sync.Pool{New: func() any { b := make([]byte, 0, 4*signedStack); return &b }}

// verify makes the checks from the signature on, with the sender's key.
func (v *Verifier) verify(env *Envelope, key ed25519.PublicKey) error {
	if !verifySignature(env, key) {
		return reject(CheckSignature, "the signature does not verify with the key of sender %s", quote(env.Sender))
	}
	if env.Namespace != v.namespace {
		return reject(CheckNamespace, "the call is signed for namespace %s, not this daemon's %s", quote(env.Namespace), quote(v.namespace))
	}
	now := v.now().UnixNano()
	if r := checkTime(env.Timestamp, now); r != nil {
		return r
	}
	if env.Timestamp < v.start {
		return reject(CheckTimestamp, "the call was signed %v before this daemon started; sign it again", time.Duration(v.start-env.Timestamp))
	}
	switch v.replay.add(&env.Nonce, env.Timestamp, now) {
	case replaySeen:
		return reject(CheckReplay, "a call of the last %v carried nonce %x: the call is replayed", Window, env.Nonce)
	case replayFull:
		return reject(CheckReplayCacheFull, "the replay cache holds its limit of %d nonces; try again in a few seconds", v.replay.max)
	}
	return nil
}

// verifySignature verifies env's signature over its signed bytes without
// allocating: the bytes are built on the stack, or for long calls in a
// pooled buffer.
func verifySignature(env *Envelope, key ed25519.PublicKey) bool {
	n := env.signedLen()
	if n <= signedStack {
		var buf [signedStack]byte
		return ed25519.Verify(key, env.appendSigned(buf[:0]), env.Signature)
	}
	if n > poolMaxCap {
		return ed25519.Verify(key, env.appendSigned(make([]byte, 0, n)), env.Signature)
	}
	bp := signedPool.Get().(*[]byte)
	b := env.appendSigned((*bp)[:0])
	ok := ed25519.Verify(key, b, env.Signature)
	*bp = b[:0]
	signedPool.Put(bp)
	return ok
}

// checkTime refuses a timestamp more than Window away from now.
func checkTime(ts, now int64) *Rejection {
	var d uint64 // |now - ts|, exact for any two int64
	var dir string
	if ts <= now {
		d, dir = uint64(now)-uint64(ts), "before"
	} else {
		d, dir = uint64(ts)-uint64(now), "after"
	}
	if d <= uint64(Window) {
		return nil
	}
	far := "more than 292 years"
	if d <= math.MaxInt64 {
		far = time.Duration(d).String()
	}
	return reject(CheckTimestamp, "the call was signed %s %s this daemon's clock, more than %v away", far, dir, Window)
}

// ReplayStats describes the replay cache, for metrics and status reports.
type ReplayStats struct {
	// Entries is the number of nonces remembered.
	Entries int
	// MaxEntries is the cap on Entries.
	MaxEntries int
	// Bytes approximates the memory the cache holds, including map
	// capacity kept from earlier entries.
	Bytes int64
}

// ReplayStats drops the replay cache's expired entries and describes it.
func (v *Verifier) ReplayStats() ReplayStats {
	bytes := v.replay.sweep(currentBucket(v.now().UnixNano()))
	return ReplayStats{
		Entries:    int(v.replay.size.Load()),
		MaxEntries: int(v.replay.max),
		Bytes:      bytes,
	}
}
