package callsig

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	c := newClock(testNow)
	s := newTestSigner(t, testInst, testKey("inst"), c.Now)
	for _, tc := range []struct {
		name string
		env  *Envelope
	}{
		{"a signed call round-trips", mustSign(t, s, "payload")},
		{"a call with no payload round-trips", mustSign(t, s, "")},
		{"an unsigned call round-trips", func() *Envelope { e := mustSign(t, s, "p"); e.Signature = nil; return e }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustMarshal(t, tc.env)
			var got Envelope
			if err := got.UnmarshalBinary(b); err != nil {
				t.Fatalf("UnmarshalBinary: %v", err)
			}
			if got.String() != tc.env.String() || !bytes.Equal(got.Payload, tc.env.Payload) || !bytes.Equal(got.Signature, tc.env.Signature) {
				t.Errorf("got %v, want %v", &got, tc.env)
			}
			if again := mustMarshal(t, &got); !bytes.Equal(again, b) {
				t.Errorf("re-marshalled bytes differ")
			}
			// The decoded envelope does not alias the input.
			for i := range b {
				b[i] = 0xff
			}
			if got.String() != tc.env.String() || !bytes.Equal(got.Payload, tc.env.Payload) {
				t.Errorf("decoded envelope changed with its input")
			}
		})
	}
}

// The wire body minus the signature is exactly the signed body: a client
// can sign "nodetrust callsig v1" 0x00 followed by the bytes it sends.
func TestSignedBytesAreTheWireBody(t *testing.T) {
	e := mustSign(t, newTestSigner(t, testInst, testKey("inst"), newClock(testNow).Now), "p")
	wire := mustMarshal(t, e)
	signed := e.appendSigned(nil)
	if len(signed) != e.signedLen() {
		t.Errorf("signedLen %d, signed bytes %d", e.signedLen(), len(signed))
	}
	body := wire[1 : len(wire)-lenSize-SignatureSize]
	if want := append([]byte(EnvelopeLabel+"\x00"), body...); !bytes.Equal(signed, want) {
		t.Errorf("signed bytes\n%x\nwant label, 0x00 and the wire body\n%x", signed, want)
	}
	if !ed25519.Verify(testKey("inst").Public().(ed25519.PublicKey), signed, e.Signature) {
		t.Error("signature does not verify over the signed bytes")
	}
}

// envelopeBytes builds an envelope encoding field by field, so that tests
// can break one field.
func envelopeBytes(version byte, fields ...[]byte) []byte {
	b := []byte{version}
	for _, f := range fields {
		b = appendField(b, f)
	}
	return b
}

func validFields() [][]byte {
	ts := binary.BigEndian.AppendUint64(nil, uint64(testNow.UnixNano()))
	return [][]byte{
		[]byte(testNS), []byte(testKeyExp), []byte(KindQuery), []byte(testInst),
		ts, bytes.Repeat([]byte{7}, NonceSize), []byte("payload"), bytes.Repeat([]byte{9}, SignatureSize),
	}
}

func withField(i int, f []byte) []byte {
	fs := validFields()
	fs[i] = f
	return envelopeBytes(EnvelopeVersion, fs...)
}

func TestUnmarshalEnvelopeRefuses(t *testing.T) {
	valid := envelopeBytes(EnvelopeVersion, validFields()...)
	var ok Envelope
	if err := ok.UnmarshalBinary(valid); err != nil {
		t.Fatalf("the valid base case does not decode: %v", err)
	}
	long := func(n int) []byte { return make([]byte, n) }
	tests := []struct {
		name   string
		data   []byte
		substr string
	}{
		{"empty input is refused", nil, "empty input"},
		{"an unknown version is refused", append([]byte{2}, valid[1:]...), "version byte is 0x02, want 0x01"},
		{"a trailing byte is refused", append(bytes.Clone(valid), 0), "1 bytes after the last field"},
		{"input cut inside a length is refused", valid[:3], "namespace length: input ends after 2 bytes of its 4"},
		{"input cut inside a field is refused", valid[:10], "namespace: input ends after 5 of its 8 bytes"},
		{"input with the signature missing is refused", valid[:len(valid)-SignatureSize-lenSize], "signature length: input ends"},
		{"an empty namespace is refused", withField(0, nil), "namespace is missing (empty)"},
		{"an empty key expression is refused", withField(1, nil), "key expression is missing"},
		{"an empty kind is refused", withField(2, nil), "kind is missing"},
		{"an empty sender is refused", withField(3, nil), "sender is missing"},
		{"an oversized namespace is refused", withField(0, long(MaxNamespaceLen+1)), "namespace is 256 bytes, more than the limit of 255"},
		{"an oversized key expression is refused", withField(1, long(MaxKeyExprLen+1)), "key expression is 1025 bytes, more than the limit of 1024"},
		{"an oversized kind is refused", withField(2, long(MaxKindLen+1)), "kind is 65 bytes"},
		{"an oversized sender is refused", withField(3, long(MaxSenderLen+1)), "sender is 256 bytes"},
		{"a 7-byte timestamp is refused", withField(4, long(7)), "timestamp is 7 bytes, want 8"},
		{"a 15-byte nonce is refused", withField(5, long(15)), "nonce is 15 bytes, want 16"},
		{"a 17-byte nonce is refused", withField(5, long(17)), "nonce is 17 bytes, want 16"},
		{"a payload length over the limit is refused before it is read", func() []byte {
			b := envelopeBytes(EnvelopeVersion, validFields()[:6]...)
			return binary.BigEndian.AppendUint32(b, MaxPayloadLen+1)
		}(), "payload is 4194305 bytes, more than the limit of 4194304"},
		{"a length of 4 GiB is refused", func() []byte {
			return binary.BigEndian.AppendUint32([]byte{EnvelopeVersion}, 0xffffffff)
		}(), "namespace is 4294967295 bytes"},
		{"a 63-byte signature is refused", withField(7, long(63)), "signature is 63 bytes, want 0 (unsigned) or 64"},
		{"a 65-byte signature is refused", withField(7, long(65)), "signature is 65 bytes, more than the limit of 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := Envelope{Sender: "untouched"}
			err := e.UnmarshalBinary(tt.data)
			wantMalformed(t, err, tt.substr)
			if !strings.HasPrefix(err.Error(), "decode envelope: malformed: ") {
				t.Errorf("error %q does not start with the operation", err)
			}
			if e.Sender != "untouched" {
				t.Errorf("a failed decode changed the envelope: %v", &e)
			}
		})
	}
}

// Every proper prefix of a valid encoding is refused.
func TestUnmarshalEnvelopeRefusesEveryTruncation(t *testing.T) {
	valid := envelopeBytes(EnvelopeVersion, validFields()...)
	for n := range len(valid) {
		var e Envelope
		if err := e.UnmarshalBinary(valid[:n]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("prefix of %d bytes: %v, want ErrMalformed", n, err)
		}
	}
}

func TestMarshalEnvelopeRefuses(t *testing.T) {
	base := func() *Envelope {
		return &Envelope{Namespace: testNS, KeyExpr: testKeyExp, Kind: KindQuery, Sender: testInst, Timestamp: 1}
	}
	tests := []struct {
		name   string
		change func(e *Envelope)
		substr string
	}{
		{"an envelope without a namespace is refused", func(e *Envelope) { e.Namespace = "" }, "namespace is missing"},
		{"an envelope without a sender is refused", func(e *Envelope) { e.Sender = "" }, "sender is missing"},
		{"an oversized key expression is refused", func(e *Envelope) { e.KeyExpr = strings.Repeat("k", MaxKeyExprLen+1) }, "key expression is 1025 bytes"},
		{"an oversized payload is refused", func(e *Envelope) { e.Payload = make([]byte, MaxPayloadLen+1) }, "payload is 4194305 bytes"},
		{"a signature of the wrong size is refused", func(e *Envelope) { e.Signature = make([]byte, 10) }, "signature is 10 bytes, want 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := base()
			tt.change(e)
			b, err := e.MarshalBinary()
			wantMalformed(t, err, tt.substr)
			if b != nil {
				t.Errorf("got bytes with an error")
			}
		})
	}
}

func TestSignerRefuses(t *testing.T) {
	key := testKey("inst")
	t.Run("a signer needs a sender", func(t *testing.T) {
		_, err := NewSigner(SignerConfig{Key: key})
		if err == nil || !strings.Contains(err.Error(), `new signer: sender "" is empty`) {
			t.Fatalf("NewSigner: %v", err)
		}
	})
	t.Run("a signer needs an Ed25519 private key", func(t *testing.T) {
		_, err := NewSigner(SignerConfig{Sender: testInst, Key: key[:32]})
		if err == nil || !strings.Contains(err.Error(), "key is 32 bytes, want an Ed25519 private key of 64") {
			t.Fatalf("NewSigner: %v", err)
		}
	})
	s := newTestSigner(t, testInst, key, newClock(testNow).Now)
	t.Run("a call without a kind is not signed", func(t *testing.T) {
		_, err := s.Sign(testNS, testKeyExp, "", nil)
		wantMalformed(t, err, "kind is missing")
	})
	t.Run("an oversized payload is not signed", func(t *testing.T) {
		_, err := s.Sign(testNS, testKeyExp, KindQuery, make([]byte, MaxPayloadLen+1))
		wantMalformed(t, err, "payload is 4194305 bytes")
	})
	t.Run("a failing random source fails the signature", func(t *testing.T) {
		s, err := NewSigner(SignerConfig{Sender: testInst, Key: key, Rand: bytes.NewReader(make([]byte, 5))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sign(testNS, testKeyExp, KindQuery, nil); err == nil || !strings.Contains(err.Error(), "read nonce") {
			t.Fatalf("Sign: %v, want a nonce error", err)
		}
	})
}

func TestSignerFillsTheEnvelope(t *testing.T) {
	c := newClock(testNow)
	key := testKey("inst")
	s := newTestSigner(t, testInst, key, c.Now)
	a := mustSign(t, s, "p")
	c.Add(time.Millisecond)
	b := mustSign(t, s, "p")
	if a.Sender != testInst || a.Namespace != testNS || a.KeyExpr != testKeyExp || a.Kind != KindQuery || string(a.Payload) != "p" {
		t.Errorf("envelope fields: %v", a)
	}
	if a.Timestamp != testNow.UnixNano() || b.Timestamp != testNow.Add(time.Millisecond).UnixNano() {
		t.Errorf("timestamps %d, %d do not follow the clock", a.Timestamp, b.Timestamp)
	}
	if a.Nonce == b.Nonce {
		t.Error("two calls got the same nonce")
	}
	if !a.Time().Equal(testNow) {
		t.Errorf("Time() = %v", a.Time())
	}
	if !s.Public().Equal(key.Public()) || s.Sender() != testInst {
		t.Error("Public or Sender do not match the config")
	}
	if str := s.String(); strings.Contains(str, string(key)) || !strings.Contains(str, testInst) {
		t.Errorf("String() = %q", str)
	}
	// The default random source gives fresh nonces too.
	d, err := NewSigner(SignerConfig{Sender: testInst, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	x, _ := d.Sign(testNS, testKeyExp, KindQuery, nil)
	y, _ := d.Sign(testNS, testKeyExp, KindQuery, nil)
	if x.Nonce == y.Nonce || x.Nonce == ([NonceSize]byte{}) {
		t.Error("default nonces repeat or are zero")
	}
}

func TestIsProbe(t *testing.T) {
	if !IsProbe(KindProbe) || IsProbe(KindQuery) || IsProbe("Probe") || IsProbe("") {
		t.Error("IsProbe accepts only \"probe\"")
	}
}
