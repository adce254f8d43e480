package localserver

import (
	"context"
	"crypto/ed25519"
	"testing"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/localapi"
	"github.com/nodetrust/nodetrust/pki"
)

// TestARevokedCertificatesCachedProofIsRefused: node-b's proof is served
// from the cache until the daemon hears that node-b's certificate was
// revoked; then it is refused, and a proof made with node-b's new
// certificate is taken.
func TestARevokedCertificatesCachedProofIsRefused(t *testing.T) {
	fl := newFleet(t, testTD)
	a := startDaemon(t, fl.state(t, "node-a", false), nil)
	stB := fl.state(t, "node-b", false)
	fed, err := localapi.DialFederation(a.fedAddr, insecureTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer fed.Close()
	cliKey := newKey(t)
	spec := proofSpec{st: stB, namespace: testTD, bootKey: newKey(t), sender: localapi.CLISender, senderKey: cliKey.Public().(ed25519.PublicKey)}
	proof := spec.build(t)
	call := func(p *callsig.MachineProof) *localv1.CallReply {
		t.Helper()
		r, err := fed.Call(context.Background(), remoteEnvelope(t, a, testTD, "node-a", "node-b", localapi.CLISender, cliKey), p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	wantOK(t, call(proof))
	hits := a.Server.proofs.Stats().Hits
	wantOK(t, call(proof))
	if got := a.Server.proofs.Stats().Hits; got != hits+1 {
		t.Fatalf("the second call's proof: %d cache hits, want %d (served from the cache)", got, hits+1)
	}

	leaf := stB.Leaf
	a.Server.PeerCertRevoked("node-b", pki.SerialHex(leaf), leaf.NotAfter)
	wantRejected(t, call(proof), callsig.CheckMachineProof, "node-b", "was revoked")
	// Built again (new bytes, so no cache entry), it is refused too.
	wantRejected(t, call(spec.build(t)), callsig.CheckMachineProof, "was revoked")

	// node-b joined again: its new certificate is taken.
	renewed := spec
	renewed.st = fl.state(t, "node-b", false)
	if pki.SerialHex(renewed.st.Leaf) == pki.SerialHex(leaf) {
		t.Fatal("the new certificate has the revoked one's serial")
	}
	wantOK(t, call(renewed.build(t)))
}
