package integration

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/localapi"
	"github.com/nodetrust/nodetrust/pki"
)

// TestCallsigAcrossMachines runs three bcd node daemons on loopback with
// certificates from one fleetd, and checks calls between them: an endorsed
// instance calls across, the launch coordinator's placement check, and the
// refusal of forged and foreign machine proofs.
func TestCallsigAcrossMachines(t *testing.T) {
	cp := startControlPlane(t, "")
	a := newCallsigNode(t, cp, "node-a", "")
	b := newCallsigNode(t, cp, "node-b", "")
	c := newCallsigNode(t, cp, "node-c", "")
	ctx := context.Background()

	launchFile := filepath.Join(t.TempDir(), "launch.toml")
	text := fmt.Sprintf("name = \"demo\"\n\n[machines.node-a]\naddress = %q\n\n[machines.node-b]\naddress = %q\n\n[machines.node-c]\naddress = %q\n\n[instances.trainer]\nnode = \"node-b\"\n",
		a.addr, b.addr, c.addr)
	if err := os.WriteFile(launchFile, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("before the launch, the daemon takes no call of an instance of another machine", func(t *testing.T) {
		got := b.instanceCall(t, "trainer", "call", "-node", "node-a", "-address", a.addr, "status", "get")
		wantRefusal(t, got, "placement", "no launch is active on this daemon, so it takes no call of an instance of another machine")
		// Nor does node-b know where node-a is.
		if got := b.instanceCall(t, "trainer", "call", "-node", "node-a", "status", "get"); !strings.Contains(got, `relay to node "node-a": this daemon knows no address of it`) {
			t.Errorf("a call to node-a before node-b knows its address: %q", got)
		}
		// The command line of another machine is no instance.
		if r := b.bcd(t, "", "call", "--node", "node-a", "--address", a.addr, "status", "get"); r.code != 0 {
			t.Fatalf("the command line of node-b calls node-a before the launch: %s", r)
		}
	})

	for _, n := range []*callsigNode{a, b, c} {
		r := n.bcd(t, "", "launch", launchFile)
		if r.code != 0 || !strings.Contains(r.stdout, `launch "demo" applied on `+n.node) {
			t.Fatalf("bcd launch on %s: %s", n.node, r)
		}
	}

	t.Run("an endorsed instance calls across", func(t *testing.T) {
		got := b.instanceCall(t, "trainer", "call", "-node", "node-a", "status", "get")
		reply, ok := strings.CutPrefix(got, "ok ")
		if !ok {
			t.Fatalf("trainer of node-b calls node-a: %q", got)
		}
		var st localapi.Status
		if err := json.Unmarshal([]byte(reply), &st); err != nil {
			t.Fatal(err)
		}
		if st.NodeID != "node-a" || st.Caller != (localapi.Principal{NodeID: "node-b", Sender: "trainer"}) || st.Launch != "demo" {
			t.Fatalf("node-a's status for trainer of node-b: %+v", st)
		}
		r := a.bcd(t, "", "call", "membership", "list")
		var m localapi.Membership
		if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
			t.Fatalf("membership: %s", r)
		}
		var sawB, placed bool
		for _, mm := range m.Machines {
			sawB = sawB || mm.NodeID == "node-b" && mm.LastCall != nil && mm.BootID != ""
		}
		for _, in := range m.Instances {
			placed = placed || in.Name == "trainer" && in.NodeID == "node-b" && in.State == localapi.InstancePlaced
		}
		if !sawB || !placed {
			t.Errorf("node-a's membership after the call: %s", r.stdout)
		}
	})

	t.Run("the command line of another machine calls across", func(t *testing.T) {
		r := b.bcd(t, "", "call", "--node", "node-a", "leases", "list")
		if r.code != 0 || !strings.Contains(r.stdout, `"gpu0"`) {
			t.Fatalf("bcd call --node node-a on node-b: %s", r)
		}
	})

	t.Run("placement: an instance the launch places on another machine", func(t *testing.T) {
		got := c.instanceCall(t, "trainer", "call", "-node", "node-a", "status", "get")
		wantRefusal(t, got, "placement", `the launch "demo" places instance "trainer" on node "node-b", not on node "node-c"`)
	})

	t.Run("placement: an instance the launch does not place", func(t *testing.T) {
		got := b.instanceCall(t, "intruder", "call", "-node", "node-a", "status", "get")
		wantRefusal(t, got, "placement", `the launch "demo" places no instance "intruder"`)
	})

	// Hand-made calls of node-b's command line, straight to node-a's
	// federation listener.
	stB, err := identity.LoadState(b.dataDir, identity.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cliB, err := localapi.ReadKeyFile(b.cliKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	fed, err := localapi.DialFederation(a.addr, anyTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer fed.Close()
	ns := cp.bundle.TrustDomain
	envelope := func(t *testing.T) *callsig.Envelope {
		t.Helper()
		ke := localapi.KeyExpr{Namespace: ns, Receiver: "node-a", Service: "status", Method: "get", SenderNode: "node-b", Sender: localapi.CLISender}
		s, err := callsig.NewSigner(callsig.SignerConfig{Sender: localapi.CLISender, Key: cliB})
		if err != nil {
			t.Fatal(err)
		}
		env, err := s.Sign(ns, ke.String(), callsig.KindQuery, []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	proof := func(t *testing.T, st *identity.State, namespace string, forge bool) *callsig.MachineProof {
		t.Helper()
		_, bootKey, _ := ed25519.GenerateKey(nil)
		statement := callsig.BootStatement{Namespace: namespace, NodeID: st.Identity.NodeID, BootID: "boot-hand", BootPublicKey: bootKey.Public().(ed25519.PublicKey)}
		stSig, err := statement.Sign(st.Key)
		if err != nil {
			t.Fatal(err)
		}
		endorsement := callsig.Endorsement{Namespace: namespace, NodeID: st.Identity.NodeID, BootID: "boot-hand", Sender: localapi.CLISender, SenderKey: cliB.Public().(ed25519.PublicKey)}
		with := bootKey
		if forge {
			_, with, _ = ed25519.GenerateKey(nil)
		}
		enSig, err := endorsement.Sign(with)
		if err != nil {
			t.Fatal(err)
		}
		return &callsig.MachineProof{Chain: st.Identity.Chain, Statement: statement, StatementSig: stSig, Endorsement: endorsement, EndorsementSig: enSig}
	}
	send := func(t *testing.T, p *callsig.MachineProof) error {
		t.Helper()
		r, err := fed.Call(ctx, envelope(t), p)
		if err != nil {
			t.Fatal(err)
		}
		return localapi.ReplyError(r)
	}

	t.Run("a hand-made proof of node-b is taken", func(t *testing.T) {
		if err := send(t, proof(t, stB, ns, false)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a call of another machine with no machine proof", func(t *testing.T) {
		wantRefusal(t, fmt.Sprint(send(t, nil)), callsig.CheckMachineProof, "a call of another machine needs a machine proof")
	})
	t.Run("a forged endorsement", func(t *testing.T) {
		wantRefusal(t, fmt.Sprint(send(t, proof(t, stB, ns, true))), callsig.CheckMachineProof,
			`the endorsement of sender "nodetrust-cli" does not verify with the boot key of the statement: it is forged`)
	})
	t.Run("a statement for another namespace", func(t *testing.T) {
		wantRefusal(t, fmt.Sprint(send(t, proof(t, stB, "other-ns", false))), callsig.CheckMachineProof,
			`the boot statement is for namespace "other-ns", not this daemon's "`+ns+`"`)
	})
	t.Run("a certificate from another trust domain", func(t *testing.T) {
		wantRefusal(t, fmt.Sprint(send(t, proof(t, foreignNode(t, "elsewhere.test", "node-b"), ns, false))), callsig.CheckMachineProof,
			"the certificate chain does not verify against this daemon's CA")
	})
	t.Run("a replayed call of another machine", func(t *testing.T) {
		env, p := envelope(t), proof(t, stB, ns, false)
		for i, want := range []string{localapi.KindOK, localapi.KindRejected} {
			r, err := fed.Call(ctx, env, p)
			if err != nil {
				t.Fatal(err)
			}
			if r.GetKind() != want || want == localapi.KindRejected && !strings.HasPrefix(r.GetMessage(), "replay: ") {
				t.Fatalf("call %d: %s %s", i+1, r.GetKind(), r.GetMessage())
			}
		}
	})
}

// foreignNode makes a node certificate of another fleet, with its own
// `fleetd init` and trust domain td, and returns it as an identity.
func foreignNode(t *testing.T, td, node string) *identity.State {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if r := run(t, "", nil, "fleetd", "init", "--dir", dir, "--trust-domain", td, "--server-name", "elsewhere.test"); r.code != 0 {
		t.Fatalf("fleetd init: %s", r)
	}
	cas, err := pki.ReadCerts(pki.Path(dir, pki.NodeCACertFile))
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := pki.ReadPrivateKey(pki.Path(dir, pki.NodeCAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	iss, err := pki.NewIssuer(cas[0], caKey, cas, td)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := iss.Issue(pki.LeafRequest{PublicKey: key.Public(), NodeID: node, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return &identity.State{Identity: identity.Identity{NodeID: node, TrustDomain: td, Chain: [][]byte{leaf.Raw, cas[0].Raw}}, Leaf: leaf, Key: key}
}
