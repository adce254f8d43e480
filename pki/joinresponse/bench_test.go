package joinresponse

import "testing"

func BenchmarkOpen(b *testing.B) {
	a := newAuthority(b)
	req := newNodeRequest(b)
	s, err := Sign(a.JoinSigner, joinResult(b, a, req, "n1", "worker", "ams1"))
	if err != nil {
		b.Fatal(err)
	}
	e := Expect{SigningKeyPin: a.Bundle.JoinSigningKeyPin, CSRSHA256: req.csrHash, PublicKey: req.key.Public(),
		TrustDomain: testTD, NodeID: "n1", Role: "worker", Now: testNow}
	for b.Loop() {
		if _, err := Open(s, e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSign is the server's signature of a join or renewal result.
func BenchmarkSign(b *testing.B) {
	a := newAuthority(b)
	r := joinResult(b, a, newNodeRequest(b), "n1", "worker", "ams1")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Sign(a.JoinSigner, r); err != nil {
			b.Fatal(err)
		}
	}
}
