package callsig_test

import (
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/pki"
)

// A client signs each call; the daemon decodes and verifies it, and refuses
// a replay and a client calling under another client's id.
func ExampleVerifier_Verify() {
	now := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now } // real code leaves Now nil

	// The daemon made a key for the instance when it started it.
	_, instKey, _ := ed25519.GenerateKey(nil)
	_, cliKey, _ := ed25519.GenerateKey(nil)

	// In the instance: sign the call and send the envelope with it.
	inst, err := callsig.NewSigner(callsig.SignerConfig{Sender: "inst-7f3a", Key: instKey, Now: clock})
	if err != nil {
		panic(err)
	}
	env, err := inst.Sign("fleet-ns", "fleet-ns/@daemon/inst-7f3a/robot_leases/v1/acquire",
		callsig.KindQuery, []byte(`{"robot":"robot-1"}`))
	if err != nil {
		panic(err)
	}
	wire, _ := env.MarshalBinary()

	// In the daemon: one verifier, which knows the key of each client.
	v, err := callsig.NewVerifier(callsig.VerifierConfig{
		Namespace: "fleet-ns",
		Keys: callsig.KeyMap{
			"inst-7f3a":     inst.Public(),
			"nodetrust-cli": cliKey.Public().(ed25519.PublicKey),
		},
		Now: clock,
	})
	if err != nil {
		panic(err)
	}
	var got callsig.Envelope
	if err := got.UnmarshalBinary(wire); err != nil {
		panic(err)
	}
	fmt.Println("first call:", v.Verify(&got))

	// The same envelope again is a replay.
	var r *callsig.Rejection
	if err := v.Verify(&got); errors.As(err, &r) {
		fmt.Println("same call again:", r.Check)
	}

	// The instance signs with its own key but gives the command line's id.
	impostor, _ := callsig.NewSigner(callsig.SignerConfig{Sender: "nodetrust-cli", Key: instKey, Now: clock})
	forged, _ := impostor.Sign("fleet-ns", "fleet-ns/@daemon/nodetrust-cli/robot_leases/v1/release",
		callsig.KindCancel, nil)
	fmt.Println(v.Verify(forged))

	// A call with no envelope at all.
	fmt.Println(v.Verify(nil))
	// Output:
	// first call: <nil>
	// same call again: replay
	// rejected: bad signature: the signature does not verify with the key of sender "nodetrust-cli"
	// rejected: no signature: the call carries no signature; a client built before calls were signed must be built again
}

// A daemon proves its instance to the daemon of another machine: it signs a
// boot statement with its node key and endorses the instance's key with its
// boot key; the other daemon checks the proof against its CA and then the
// call under the endorsed key.
func ExampleVerifyMachineProof() {
	now := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

	// The fleet's PKI, as `fleetd init` makes it.
	dir, err := os.MkdirTemp("", "callsig-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	if _, err := pki.Init(dir, pki.InitOptions{TrustDomain: "fleet.example", Now: now}); err != nil {
		panic(err)
	}
	ca, err := pki.LoadAuthority(dir)
	if err != nil {
		panic(err)
	}

	// Machine A: its node certificate, and at boot its boot key and
	// statement.
	nodeKey, _ := pki.GenerateKey()
	leaf, err := ca.Issuer.Issue(pki.LeafRequest{PublicKey: nodeKey.Public(), NodeID: "node-a",
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour)})
	if err != nil {
		panic(err)
	}
	bootPub, bootKey, _ := ed25519.GenerateKey(nil)
	st := callsig.BootStatement{Namespace: "fleet-ns", NodeID: "node-a", BootID: "boot-42", BootPublicKey: bootPub}
	stSig, err := st.Sign(nodeKey)
	if err != nil {
		panic(err)
	}
	// It starts an instance and endorses the instance's key.
	_, instKey, _ := ed25519.GenerateKey(nil)
	inst, _ := callsig.NewSigner(callsig.SignerConfig{Sender: "inst-7f3a", Key: instKey, Now: func() time.Time { return now }})
	en := callsig.Endorsement{Namespace: "fleet-ns", NodeID: "node-a", BootID: "boot-42",
		Sender: inst.Sender(), SenderKey: inst.Public()}
	enSig, err := en.Sign(bootKey)
	if err != nil {
		panic(err)
	}
	proof := callsig.MachineProof{
		Chain:     [][]byte{leaf.Raw, ca.NodeCA.Raw},
		Statement: st, StatementSig: stSig,
		Endorsement: en, EndorsementSig: enSig,
	}
	proofWire, _ := proof.MarshalBinary()
	call, _ := inst.Sign("fleet-ns", "fleet-ns/@daemon/node-b/robot_membership/v1/join", callsig.KindQuery, nil)

	// Machine B checks the proof, then the call.
	roots := x509.NewCertPool()
	roots.AddCert(ca.Root)
	trust := callsig.TrustBundle{Roots: roots, TrustDomain: "fleet.example"}
	var got callsig.MachineProof
	if err := got.UnmarshalBinary(proofWire); err != nil {
		panic(err)
	}
	peer, err := callsig.VerifyMachineProof(&got, trust, "fleet-ns", now)
	if err != nil {
		panic(err)
	}
	fmt.Println("peer:", peer.Sender, "of", peer.NodeID, "boot", peer.BootID)
	v, _ := callsig.NewVerifier(callsig.VerifierConfig{Namespace: "fleet-ns", Keys: callsig.KeyMap{},
		Now: func() time.Time { return now }})
	fmt.Println("call:", v.VerifyPeer(call, peer))

	// The same proof does not admit calls to a daemon of another
	// namespace.
	_, err = callsig.VerifyMachineProof(&got, trust, "other-ns", now)
	fmt.Println(err)
	// Output:
	// peer: inst-7f3a of node-a boot boot-42
	// call: <nil>
	// rejected: machine proof: the boot statement is for namespace "fleet-ns", not this daemon's "other-ns"
}

// A daemon answers a probe without checking a signature, and verifies
// every other call.
func ExampleIsProbe() {
	for _, kind := range []string{callsig.KindProbe, callsig.KindQuery, callsig.KindCancel} {
		fmt.Println(kind, callsig.IsProbe(kind))
	}
	// Output:
	// probe true
	// query false
	// cancel false
}
