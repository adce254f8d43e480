package joinresponse

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
)

func TestOpen(t *testing.T) {
	a := newAuthority(t)
	req := newNodeRequest(t)
	r := joinResult(t, a, req, "n1", "worker", "ams1")
	s, err := Sign(a.JoinSigner, r)
	if err != nil {
		t.Fatal(err)
	}
	if s.GetKid() != a.Bundle.JoinSigningKeyPin.String() {
		t.Errorf("kid = %q, want %s", s.GetKid(), a.Bundle.JoinSigningKeyPin)
	}
	if len(s.GetSignature()) != 64 {
		t.Errorf("signature is %d bytes, want 64", len(s.GetSignature()))
	}
	o, err := Open(s, Expect{
		SigningKeyPin: a.Bundle.JoinSigningKeyPin,
		CSRSHA256:     req.csrHash,
		PublicKey:     req.key.Public(),
		TrustDomain:   testTD,
		NodeID:        "n1",
		Role:          "worker",
		Now:           testNow,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(o.Result, r) {
		t.Error("opened result differs from the signed one")
	}
	if len(o.Chain) != 2 || o.Leaf != o.Chain[0] || !o.Chain[1].Equal(a.NodeCA) {
		t.Errorf("chain has %d certificates, want leaf then node CA", len(o.Chain))
	}
	if len(o.Roots) != 1 || !o.Roots[0].Equal(a.Root) {
		t.Error("roots are not the authority's root")
	}
	want := pki.NodeCertInfo{NodeID: "n1", TrustDomain: testTD, SPIFFEID: pki.NodeSPIFFEID(testTD, "n1"), Role: "worker", Site: "ams1"}
	if o.Info.NodeID != want.NodeID || o.Info.SPIFFEID != want.SPIFFEID || o.Info.Role != want.Role || o.Info.Site != want.Site {
		t.Errorf("Info = %+v, want %+v", o.Info, want)
	}

	t.Run("empty expectations accept what the result says", func(t *testing.T) {
		if _, err := Open(s, Expect{SigningKeyPin: a.Bundle.JoinSigningKeyPin, CSRSHA256: req.csrHash, PublicKey: req.key.Public(), Now: testNow}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSignIsDeterministic(t *testing.T) {
	a := newAuthority(t)
	r := joinResult(t, a, newNodeRequest(t), "n1", "worker", "")
	s1, err := Sign(a.JoinSigner, r)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := Sign(a.JoinSigner, r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s1.GetPayload(), s2.GetPayload()) {
		t.Error("payloads of one result differ")
	}
}

// TestSignNamesEachSignersKey: results signed by two servers' keys in
// turn each name and open under their own key, whatever was signed
// before, and a result's signing key is its own to change.
func TestSignNamesEachSignersKey(t *testing.T) {
	authorities := []*pki.Authority{newAuthority(t), newAuthority(t)}
	req := newNodeRequest(t)
	for i := range 6 {
		a := authorities[i%2]
		want, err := x509.MarshalPKIXPublicKey(a.JoinSigner.Public())
		if err != nil {
			t.Fatal(err)
		}
		s, err := Sign(a.JoinSigner, joinResult(t, a, req, "n1", "worker", ""))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(s.GetSigningKey(), want) || s.GetKid() != a.Bundle.JoinSigningKeyPin.String() {
			t.Fatalf("result %d names key %x, kid %s; want %x, %s", i, s.GetSigningKey(), s.GetKid(), want, a.Bundle.JoinSigningKeyPin)
		}
		if _, err := Open(s, Expect{SigningKeyPin: a.Bundle.JoinSigningKeyPin, CSRSHA256: req.csrHash, PublicKey: req.key.Public(), Now: testNow}); err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
		s.SigningKey[len(s.SigningKey)-1] ^= 1
	}
}

func TestOpenRefuses(t *testing.T) {
	a := newAuthority(t)
	other := newAuthority(t)
	req := newNodeRequest(t)
	otherReq := newNodeRequest(t)

	// sign builds a signed response, letting a case edit the result first.
	sign := func(t *testing.T, edit func(r *joinv1.JoinResult)) *joinv1.SignedJoinResult {
		r := joinResult(t, a, req, "n1", "worker", "ams1")
		if edit != nil {
			edit(r)
		}
		s, err := Sign(a.JoinSigner, r)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// signPayload signs arbitrary bytes with the trusted key.
	signPayload := func(t *testing.T, payload []byte) *joinv1.SignedJoinResult {
		s := sign(t, nil)
		sig, err := pki.SignP1363(a.JoinSigner, Digest(payload))
		if err != nil {
			t.Fatal(err)
		}
		s.Payload, s.Signature = payload, sig
		return s
	}
	expect := Expect{
		SigningKeyPin: a.Bundle.JoinSigningKeyPin,
		CSRSHA256:     req.csrHash,
		PublicKey:     req.key.Public(),
		Now:           testNow,
	}
	otherLeaf := issueLeaf(t, a.Issuer, req.key, "n2", "worker", "ams1")

	tests := []struct {
		name   string
		signed func(t *testing.T) *joinv1.SignedJoinResult
		edit   func(e *Expect)
		want   string
	}{
		{
			name:   "a response signed by another key is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return sign(t, nil) },
			edit:   func(e *Expect) { e.SigningKeyPin = other.Bundle.JoinSigningKeyPin },
			want:   "is not the trusted join signing key pin",
		},
		{
			name: "a response signed and presented by another key is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				s, err := Sign(other.JoinSigner, joinResult(t, a, req, "n1", "worker", "ams1"))
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
			want: "signing key pin",
		},
		{
			name: "a kid other than the pin is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				s := sign(t, nil)
				s.Kid = other.Bundle.JoinSigningKeyPin.String()
				return s
			},
			want: `kid "sha256:`,
		},
		{
			name: "a tampered signature is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				s := sign(t, nil)
				s.Signature[5] ^= 1
				return s
			},
			want: "signature does not verify",
		},
		{
			name: "a tampered payload is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				s := sign(t, nil)
				s.Payload[len(s.Payload)-1] ^= 1
				return s
			},
			want: "signature does not verify",
		},
		{
			name:   "a signed payload that is not a JoinResult is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return signPayload(t, []byte{0xff, 0xff, 0xff}) },
			want:   "payload is not a JoinResult",
		},
		{
			name:   "a response for another CSR is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return sign(t, nil) },
			edit:   func(e *Expect) { e.CSRSHA256 = otherReq.csrHash },
			want:   "csr_sha256 is not this request's CSR hash",
		},
		{
			name:   "a leaf that certifies another key is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return sign(t, nil) },
			edit:   func(e *Expect) { e.PublicKey = otherReq.key.Public() },
			want:   "leaf certificate certifies another key",
		},
		{
			name: "a chain that does not reach the roots is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				return sign(t, func(r *joinv1.JoinResult) { r.Roots = [][]byte{other.Root.Raw} })
			},
			want: "chain does not verify to the result's roots",
		},
		{
			name:   "an expired chain is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return sign(t, nil) },
			edit:   func(e *Expect) { e.Now = testNow.Add(48 * time.Hour) },
			want:   "chain does not verify",
		},
		{
			name: "an empty chain is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				return sign(t, func(r *joinv1.JoinResult) { r.Chain = nil })
			},
			want: "chain is empty",
		},
		{
			name: "a leaf SPIFFE ID other than spiffe_id is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				return sign(t, func(r *joinv1.JoinResult) { r.SpiffeId = pki.NodeSPIFFEID(testTD, "n2") })
			},
			want: `leaf SPIFFE ID "spiffe://example.test/node/n1" is not the result's spiffe_id`,
		},
		{
			name: "a spiffe_id not made of trust_domain and node_id is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				return sign(t, func(r *joinv1.JoinResult) { r.NodeId = "n2" })
			},
			want: "is not \"spiffe://example.test/node/n2\" made of trust_domain and node_id",
		},
		{
			name: "a leaf for another node id is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				return sign(t, func(r *joinv1.JoinResult) { r.Chain[0] = otherLeaf.Raw })
			},
			want: "leaf SPIFFE ID \"spiffe://example.test/node/n2\"",
		},
		{
			name:   "another trust domain than expected is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return sign(t, nil) },
			edit:   func(e *Expect) { e.TrustDomain = "other.test" },
			want:   `trust domain "example.test" is not the expected "other.test"`,
		},
		{
			name:   "another node id than expected is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return sign(t, nil) },
			edit:   func(e *Expect) { e.NodeID = "n9" },
			want:   `node id "n1" is not the expected "n9"`,
		},
		{
			name:   "another role than expected is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return sign(t, nil) },
			edit:   func(e *Expect) { e.Role = "db" },
			want:   `role "worker" is not the expected "db"`,
		},
		{
			name: "a result role other than the certificate's is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				return sign(t, func(r *joinv1.JoinResult) { r.Role = "db" })
			},
			want: `leaf role "worker" is not the result's role "db"`,
		},
		{
			name: "a result site other than the certificate's is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult {
				return sign(t, func(r *joinv1.JoinResult) { r.Site = "fra1" })
			},
			want: `leaf site "ams1" is not the result's site "fra1"`,
		},
		{
			name:   "no signed result is refused",
			signed: func(t *testing.T) *joinv1.SignedJoinResult { return nil },
			want:   "no signed result",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := expect
			if tt.edit != nil {
				tt.edit(&e)
			}
			_, err := Open(tt.signed(t), e)
			wantErr(t, err, ErrRefused, tt.want)
		})
	}
}

func TestOpenNeedsExpectations(t *testing.T) {
	a := newAuthority(t)
	req := newNodeRequest(t)
	s, err := Sign(a.JoinSigner, joinResult(t, a, req, "n1", "worker", ""))
	if err != nil {
		t.Fatal(err)
	}
	full := Expect{SigningKeyPin: a.Bundle.JoinSigningKeyPin, CSRSHA256: req.csrHash, PublicKey: req.key.Public(), Now: testNow}
	tests := []struct {
		name, want string
		edit       func(e *Expect)
	}{
		{"a missing pin is a caller error", "expected signing key pin is not set", func(e *Expect) { e.SigningKeyPin = pki.Pin{} }},
		{"a short CSR hash is a caller error", "expected CSR hash is 0 bytes", func(e *Expect) { e.CSRSHA256 = nil }},
		{"a missing node key is a caller error", "expected node public key is not set", func(e *Expect) { e.PublicKey = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := full
			tt.edit(&e)
			_, err := Open(s, e)
			wantErr(t, err, nil, tt.want)
		})
	}
}

func TestDigest(t *testing.T) {
	got := Digest([]byte("payload"))
	want := sha256.Sum256([]byte("nodetrust join-response v1\x00payload"))
	if !bytes.Equal(got, want[:]) {
		t.Errorf("digest = %x, want %x", got, want)
	}
}
