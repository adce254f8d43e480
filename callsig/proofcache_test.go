package callsig

import (
	"crypto/x509"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki"
)

func mustMarshalProof(tb testing.TB, p *MachineProof) []byte {
	tb.Helper()
	b, err := p.MarshalBinary()
	if err != nil {
		tb.Fatalf("MarshalBinary: %v", err)
	}
	return b
}

func TestProofCacheServesWhatVerifies(t *testing.T) {
	f := newTestFleet(t, testTD)
	m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
	b := mustMarshalProof(t, m.proof(t, testInst, instPub()))
	c := NewProofCache(0)

	for i := range 3 {
		peer, err := c.Verify(b, f.trust, testNS, testNow)
		if err != nil {
			t.Fatalf("Verify %d: %v", i, err)
		}
		if peer.NodeID != testNode || peer.BootID != testBoot || peer.Sender != testInst || !peer.SenderKey.Equal(instPub()) {
			t.Fatalf("Verify %d: peer = %+v", i, peer)
		}
		peer.SenderKey[0] ^= 1 // the caller's copy: the cache's stays intact
	}
	if st := c.Stats(); st.Entries != 1 || st.Hits != 2 || st.Misses != 1 {
		t.Errorf("stats = %+v, want 1 entry, 2 hits, 1 miss", st)
	}

	// Past the leaf's NotAfter the cached entry does not serve: the full
	// check refuses the expired chain.
	_, err := c.Verify(b, f.trust, testNS, m.leaf.NotAfter.Add(time.Second))
	wantRejection(t, err, CheckMachineProof, "expired or not yet valid")
	// Before its NotBefore neither.
	_, err = c.Verify(b, f.trust, testNS, m.leaf.NotBefore.Add(-time.Second))
	wantRejection(t, err, CheckMachineProof, "expired or not yet valid")

	// Another namespace, another trust domain or another pool of roots
	// (even holding the same root) is verified again, and refused where
	// the full check refuses.
	_, err = c.Verify(b, f.trust, "other-ns", testNow)
	wantRejection(t, err, CheckMachineProof, "not this daemon's")
	_, err = c.Verify(b, TrustBundle{Roots: f.trust.Roots, TrustDomain: "other.test"}, testNS, testNow)
	wantRejection(t, err, CheckMachineProof, "trust domain")
	other := newTestFleet(t, testTD)
	_, err = c.Verify(b, other.trust, testNS, testNow)
	wantRejection(t, err, CheckMachineProof, "does not verify against this daemon's CA")
	_, err = c.Verify(b, TrustBundle{}, testNS, testNow)
	wantRejection(t, err, CheckMachineProof, "no machine CA")
	same := x509.NewCertPool()
	same.AddCert(f.auth.Root)
	before := c.Stats().Misses
	if _, err := c.Verify(b, TrustBundle{Roots: same, TrustDomain: testTD}, testNS, testNow); err != nil {
		t.Fatalf("Verify against a new pool of the same root: %v", err)
	}
	if c.Stats().Misses != before+1 {
		t.Errorf("a new pool of roots was served from the cache")
	}

	// One changed byte is another proof: a forged endorsement is refused
	// even though the rest of the proof is cached.
	forged := append([]byte(nil), b...)
	forged[len(forged)-1] ^= 1
	_, err = c.Verify(forged, f.trust, testNS, testNow)
	wantRejection(t, err, CheckMachineProof, "forged")

	// Bytes that do not decode, and no proof at all.
	_, err = c.Verify(b[:len(b)-1], f.trust, testNS, testNow)
	wantRejection(t, err, CheckMachineProof, "does not decode")
	if !errors.Is(err, ErrMalformed) {
		t.Errorf("undecodable proof: %v does not wrap ErrMalformed", err)
	}
	_, err = c.Verify(nil, f.trust, testNS, testNow)
	wantRejection(t, err, CheckMachineProof, "needs a machine proof")
}

func TestProofCacheForgetsARevokedNode(t *testing.T) {
	f := newTestFleet(t, testTD)
	a := mustMarshalProof(t, newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub()))
	bm := newTestMachine(t, f.auth.Issuer, otherNode, testNS)
	b := mustMarshalProof(t, bm.proof(t, testInst, instPub()))
	c := NewProofCache(0)
	for _, p := range [][]byte{a, b} {
		if _, err := c.Verify(p, f.trust, testNS, testNow); err != nil {
			t.Fatal(err)
		}
	}
	c.ForgetNode(testNode)
	if st := c.Stats(); st.Entries != 1 {
		t.Fatalf("after ForgetNode: %d entries, want 1", st.Entries)
	}
	misses := c.Stats().Misses
	if _, err := c.Verify(b, f.trust, testNS, testNow); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(a, f.trust, testNS, testNow); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().Misses - misses; got != 1 {
		t.Errorf("after ForgetNode(%s): %d misses, want 1 (its proof verified again, the other node's served)", testNode, got)
	}
}

func TestProofCacheIsBounded(t *testing.T) {
	f := newTestFleet(t, testTD)
	m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
	const max = 3
	c := NewProofCache(max)
	var proofs [][]byte
	for i := range 2 * max {
		p := m.proof(t, testInst+string(rune('a'+i)), instPub())
		proofs = append(proofs, mustMarshalProof(t, p))
	}
	for i, p := range proofs {
		if _, err := c.Verify(p, f.trust, testNS, testNow); err != nil {
			t.Fatalf("proof %d: %v", i, err)
		}
		if n := c.Stats().Entries; n > max {
			t.Fatalf("after %d proofs the cache holds %d entries, over its cap of %d", i+1, n, max)
		}
	}
	// The newest are kept, the oldest evicted.
	misses := c.Stats().Misses
	if _, err := c.Verify(proofs[len(proofs)-1], f.trust, testNS, testNow); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(proofs[0], f.trust, testNS, testNow); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().Misses - misses; got != 1 {
		t.Errorf("%d misses, want 1: the newest proof served, the oldest evicted", got)
	}
}

func TestProofCacheRefusesARevokedCertificate(t *testing.T) {
	f := newTestFleet(t, testTD)
	a := mustMarshalProof(t, newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub()))
	old := newTestMachine(t, f.auth.Issuer, otherNode, testNS)
	b := mustMarshalProof(t, old.proof(t, testInst, instPub()))
	// The same node with another certificate (one it got later).
	renewed := mustMarshalProof(t, newTestMachine(t, f.auth.Issuer, otherNode, testNS).proof(t, testInst, instPub()))
	c := NewProofCache(0)
	for _, p := range [][]byte{a, b} {
		if _, err := c.Verify(p, f.trust, testNS, testNow); err != nil {
			t.Fatal(err)
		}
	}
	// Another serial of the node refuses nothing, but drops its entries.
	c.RevokeCert(otherNode, "0badc0de", time.Time{}, testNow)
	if _, err := c.Verify(b, f.trust, testNS, testNow); err != nil {
		t.Fatalf("proof of a certificate not revoked: %v", err)
	}
	// Its own serial refuses the cached proof, and again when the proof
	// is verified in full; the other node is still served from the cache,
	// and the node's other certificate is accepted.
	c.RevokeCert(otherNode, pki.SerialHex(old.leaf), old.leaf.NotAfter, testNow)
	if n := c.Stats().Entries; n != 1 {
		t.Errorf("after RevokeCert: %d entries, want 1", n)
	}
	for range 2 {
		_, err := c.Verify(b, f.trust, testNS, testNow)
		wantRejection(t, err, CheckMachineProof, "was revoked")
	}
	if n := c.Stats().Entries; n != 1 {
		t.Errorf("the refused proof was cached: %d entries, want 1", n)
	}
	hits := c.Stats().Hits
	if _, err := c.Verify(a, f.trust, testNS, testNow); err != nil || c.Stats().Hits != hits+1 {
		t.Errorf("the other node's proof: err %v, hits %d → %d, want served from the cache", err, hits, c.Stats().Hits)
	}
	if _, err := c.Verify(renewed, f.trust, testNS, testNow); err != nil {
		t.Errorf("the node's certificate that was not revoked: %v", err)
	}
	if st := c.Stats(); st.RevokedCerts != 2 {
		t.Errorf("RevokedCerts = %d, want 2", st.RevokedCerts)
	}
}

func TestProofCacheRevocationsAreBounded(t *testing.T) {
	c := NewProofCache(0)
	for i := range MaxRevokedCerts + 10 {
		// The first ten expired an hour ago, the rest expire later.
		notAfter := testNow.Add(time.Hour + time.Duration(i)*time.Second)
		if i < 10 {
			notAfter = testNow.Add(-time.Hour)
		}
		c.RevokeCert("node", fmt.Sprintf("%x", i), notAfter, testNow)
	}
	if n := c.Stats().RevokedCerts; n > MaxRevokedCerts {
		t.Fatalf("%d revocations remembered, over the bound of %d", n, MaxRevokedCerts)
	}
	c.mu.Lock()
	_, expired := c.revoked["0"]
	_, newest := c.revoked[fmt.Sprintf("%x", MaxRevokedCerts+9)]
	c.mu.Unlock()
	if expired || !newest {
		t.Errorf("after the bound was reached: the expired record kept %v, the newest kept %v; want false, true", expired, newest)
	}
}
