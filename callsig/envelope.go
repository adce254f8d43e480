package callsig

import (
	"crypto/ed25519"
	"encoding/hex"
	"strconv"
	"time"
)

// EnvelopeLabel starts the bytes an envelope's signature covers:
// "nodetrust callsig v1", one zero byte, then the signed fields.
const EnvelopeLabel = "nodetrust callsig v1"

// EnvelopeVersion is the first byte of an envelope's wire encoding.
const EnvelopeVersion byte = 1

// Sizes and limits of an envelope's fields. Every string field must be
// non-empty; the payload may be empty. [Envelope.UnmarshalBinary] refuses
// larger fields, and [Signer.Sign] does not sign them.
const (
	MaxNamespaceLen = 255
	MaxKeyExprLen   = 1024
	MaxKindLen      = 64
	MaxSenderLen    = 255
	MaxPayloadLen   = 4 << 20 // 4 MiB
	NonceSize       = 16
	SignatureSize   = ed25519.SignatureSize // 64
)

// MaxEnvelopeLen is the length of the longest valid envelope encoding.
const MaxEnvelopeLen = 1 + 8*lenSize + MaxNamespaceLen + MaxKeyExprLen + MaxKindLen +
	MaxSenderLen + 8 + NonceSize + MaxPayloadLen + SignatureSize

// Kinds of calls this package knows of. Kind is free text to the signature;
// these are the values nodetrust's daemons and clients use.
const (
	KindQuery  = "query"
	KindCancel = "cancel"
	KindProbe  = "probe"
)

// IsProbe reports whether kind is [KindProbe]. A probe only tells a client
// that a service is there, so a daemon answers it without verifying a
// signature. The kind a call claims is untrusted: the daemon must answer a
// call it does not verify with presence alone, never run anything for it.
func IsProbe(kind string) bool { return kind == KindProbe }

// Envelope is one signed call. Every field but Signature is covered by the
// signature, in the encoding docs/callsig.md describes ("signed bytes").
//
// All fields of an envelope a daemon receives are untrusted until
// [Verifier.Verify] or [Verifier.VerifyPeer] accepts it.
type Envelope struct {
	// Namespace is the namespace of the caller's session.
	Namespace string
	// KeyExpr is the key expression of the call; it names the sender and
	// the receiver. This package does not interpret it: the daemon checks
	// that it names itself as receiver and Sender as sender, and that it is
	// the key expression the call arrived on.
	KeyExpr string
	// Kind is the kind of the call, such as [KindQuery] or [KindCancel].
	Kind string
	// Sender is the id of the client that signed: an instance id, the
	// command line's id or a daemon's id. The daemon looks up its key by
	// this id.
	Sender string
	// Timestamp is the signing time in Unix nanoseconds.
	Timestamp int64
	// Nonce is random, fresh for each call.
	Nonce [NonceSize]byte
	// Payload is the call's payload. A signed envelope refers to the
	// payload given to [Signer.Sign]; it is not copied.
	Payload []byte
	// Signature is the Ed25519 signature of the signed bytes, or empty for
	// an unsigned call.
	Signature []byte
}

// Time returns Timestamp as a time.Time.
func (e *Envelope) Time() time.Time { return time.Unix(0, e.Timestamp) }

// String describes the envelope for logs and tests without its payload or
// signature: sender, namespace, key expression, kind, time and nonce.
func (e *Envelope) String() string {
	if e == nil {
		return "callsig.Envelope(nil)"
	}
	return "callsig.Envelope{sender=" + quote(e.Sender) + " namespace=" + quote(e.Namespace) +
		" key_expr=" + quote(e.KeyExpr) + " kind=" + quote(e.Kind) +
		" time=" + e.Time().UTC().Format(time.RFC3339Nano) + " nonce=" + hex.EncodeToString(e.Nonce[:]) + "}"
}

// check reports the first field that breaks the format's limits. The
// signature may be empty (an unsigned call) or SignatureSize bytes.
func (e *Envelope) check() error {
	const what = "envelope"
	if err := checkLen(what, "namespace", len(e.Namespace), 1, MaxNamespaceLen); err != nil {
		return err
	}
	if err := checkLen(what, "key expression", len(e.KeyExpr), 1, MaxKeyExprLen); err != nil {
		return err
	}
	if err := checkLen(what, "kind", len(e.Kind), 1, MaxKindLen); err != nil {
		return err
	}
	if err := checkLen(what, "sender", len(e.Sender), 1, MaxSenderLen); err != nil {
		return err
	}
	if err := checkLen(what, "payload", len(e.Payload), 0, MaxPayloadLen); err != nil {
		return err
	}
	if len(e.Signature) != 0 {
		return checkLen(what, "signature", len(e.Signature), SignatureSize, SignatureSize)
	}
	return nil
}

// signedLen is the length of the signed bytes of e.
func (e *Envelope) signedLen() int {
	return len(EnvelopeLabel) + 1 + 7*lenSize + len(e.Namespace) + len(e.KeyExpr) +
		len(e.Kind) + len(e.Sender) + 8 + NonceSize + len(e.Payload)
}

// appendSigned appends what the signature covers:
//
//	"nodetrust callsig v1" 0x00 F(namespace) F(key_expr) F(kind) F(sender)
//	F(timestamp) F(nonce) F(payload)
//
// where F(x) is x's length as 4 bytes big-endian followed by x.
func (e *Envelope) appendSigned(dst []byte) []byte {
	dst = append(dst, EnvelopeLabel...)
	dst = append(dst, 0)
	return e.appendBody(dst)
}

// appendBody appends the fields shared by the signed bytes and the wire
// encoding, in order.
func (e *Envelope) appendBody(dst []byte) []byte {
	dst = appendField(dst, e.Namespace)
	dst = appendField(dst, e.KeyExpr)
	dst = appendField(dst, e.Kind)
	dst = appendField(dst, e.Sender)
	dst = appendInt64Field(dst, e.Timestamp)
	dst = appendField(dst, e.Nonce[:])
	return appendField(dst, e.Payload)
}

// MarshalBinary returns the wire encoding of the envelope:
//
//	0x01 F(namespace) F(key_expr) F(kind) F(sender) F(timestamp) F(nonce)
//	F(payload) F(signature)
//
// The encoding is deterministic: equal envelopes give equal bytes. It
// refuses, with an error wrapping [ErrMalformed], an envelope that breaks
// the limits of the format. An unsigned envelope (empty Signature) can be
// encoded; a daemon refuses it.
func (e *Envelope) MarshalBinary() ([]byte, error) {
	if err := e.check(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 1+e.signedLen()-len(EnvelopeLabel)-1+lenSize+len(e.Signature))
	b = append(b, EnvelopeVersion)
	b = e.appendBody(b)
	return appendField(b, e.Signature), nil
}

// UnmarshalBinary decodes the wire encoding of an envelope into e. It
// refuses, with an error wrapping [ErrMalformed], an unknown version, a
// missing (empty) string field, a field over its limit or of the wrong
// size, input that ends early and bytes after the last field, so a decoded
// envelope marshals back to exactly data. It does not verify anything:
// that is [Verifier.Verify]'s job. e does not alias data.
func (e *Envelope) UnmarshalBinary(data []byte) error {
	r := reader{what: "envelope", b: data}
	r.version(EnvelopeVersion)
	ns := r.field("namespace", 1, MaxNamespaceLen)
	ke := r.field("key expression", 1, MaxKeyExprLen)
	kind := r.field("kind", 1, MaxKindLen)
	sender := r.field("sender", 1, MaxSenderLen)
	ts := r.int64Field("timestamp")
	nonce := r.field("nonce", NonceSize, NonceSize)
	payload := r.field("payload", 0, MaxPayloadLen)
	sig := r.field("signature", 0, SignatureSize)
	if r.err == nil && len(sig) != 0 && len(sig) != SignatureSize {
		r.fail("signature is %d bytes, want 0 (unsigned) or %d", len(sig), SignatureSize)
	}
	r.end()
	if r.err != nil {
		return r.err
	}
	// One string holds the four string fields, and one slice the payload
	// and the signature.
	var tmp [MaxNamespaceLen + MaxKeyExprLen + MaxKindLen + MaxSenderLen]byte
	strs := string(append(append(append(append(tmp[:0], ns...), ke...), kind...), sender...))
	var buf []byte
	if n := len(payload) + len(sig); n > 0 {
		buf = make([]byte, n)
		copy(buf, payload)
		copy(buf[len(payload):], sig)
	}
	i, j, k := len(ns), len(ns)+len(ke), len(ns)+len(ke)+len(kind)
	*e = Envelope{
		Namespace: strs[:i],
		KeyExpr:   strs[i:j],
		Kind:      strs[j:k],
		Sender:    strs[k:],
		Timestamp: ts,
	}
	copy(e.Nonce[:], nonce)
	if len(payload) > 0 {
		e.Payload = buf[:len(payload):len(payload)]
	}
	if len(sig) > 0 {
		e.Signature = buf[len(payload):]
	}
	return nil
}

// quote is strconv.Quote for short untrusted strings in messages.
func quote(s string) string {
	const limit = 80
	if len(s) > limit {
		s = s[:limit] + "…"
	}
	return strconv.Quote(s)
}
