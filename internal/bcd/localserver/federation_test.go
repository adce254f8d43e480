package localserver

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/bcd/launch"
	"github.com/nodetrust/nodetrust/localapi"
)

// applyLaunch applies l on d as the command line.
func applyLaunch(t *testing.T, d *testDaemon, l *launch.Launch) {
	t.Helper()
	if err := d.cli(t).Call(context.Background(), localapi.ServiceLaunch, localapi.MethodApply, l, nil); err != nil {
		t.Fatal(err)
	}
}

// proofSpec builds a machine proof by hand, to forge its parts.
type proofSpec struct {
	st            *identity.State // the chain and the node key of the statement
	namespace     string          // of the statement and the endorsement
	bootKey       ed25519.PrivateKey
	endorseWith   ed25519.PrivateKey // nil: bootKey
	sender        string
	senderKey     ed25519.PublicKey
	statementNode string // "": the certificate's
}

func (p proofSpec) build(t *testing.T) *callsig.MachineProof {
	t.Helper()
	node := p.st.Identity.NodeID
	stNode := node
	if p.statementNode != "" {
		stNode = p.statementNode
	}
	st := callsig.BootStatement{Namespace: p.namespace, NodeID: stNode, BootID: "boot-test", BootPublicKey: p.bootKey.Public().(ed25519.PublicKey)}
	stSig, err := st.Sign(p.st.Key)
	if err != nil {
		t.Fatal(err)
	}
	en := callsig.Endorsement{Namespace: p.namespace, NodeID: stNode, BootID: "boot-test", Sender: p.sender, SenderKey: p.senderKey}
	with := p.endorseWith
	if with == nil {
		with = p.bootKey
	}
	enSig, err := en.Sign(with)
	if err != nil {
		t.Fatal(err)
	}
	return &callsig.MachineProof{Chain: p.st.Identity.Chain, Statement: st, StatementSig: stSig, Endorsement: en, EndorsementSig: enSig}
}

// remoteEnvelope signs a call of sender of node to receiver's status.
func remoteEnvelope(t *testing.T, d *testDaemon, ns, receiver, node, sender string, key ed25519.PrivateKey) *callsig.Envelope {
	t.Helper()
	ke := localapi.KeyExpr{Namespace: ns, Receiver: receiver, Service: localapi.ServiceStatus, Method: localapi.MethodGet, SenderNode: node, Sender: sender}
	env, err := d.signer(t, sender, key, 0).Sign(ns, ke.String(), callsig.KindQuery, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestCallsAcrossMachines(t *testing.T) {
	fl := newFleet(t, testTD)
	a := startDaemon(t, fl.state(t, "node-a", false), nil)
	stB := fl.state(t, "node-b", false)
	b := startDaemon(t, stB, nil)
	l := &launch.Launch{Name: "demo",
		Machines:  map[string]launch.Machine{"node-a": {Address: a.fedAddr}, "node-b": {Address: b.fedAddr}},
		Instances: map[string]launch.Instance{"trainer": {Node: "node-b"}}}
	applyLaunch(t, b, l)
	ctx := context.Background()
	toA := localapi.Call{Node: "node-a", Service: localapi.ServiceStatus, Method: localapi.MethodGet}

	t.Run("no launch is active on the receiver", func(t *testing.T) {
		in := b.startInstance(t, "trainer")
		c := b.client(t, b.signer(t, "trainer", in.key, 0))
		wantRejected(t, send(t, c, toA), checkPlacement, "no launch is active on this daemon")
		in.exit(t)
	})
	applyLaunch(t, a, l)

	t.Run("an endorsed instance calls across", func(t *testing.T) {
		in := b.startInstance(t, "trainer")
		defer in.exit(t)
		c := b.client(t, b.signer(t, "trainer", in.key, 0))
		var st localapi.Status
		if err := c.Do(ctx, toA, &st); err != nil {
			t.Fatal(err)
		}
		if st.NodeID != "node-a" || st.Caller != (localapi.Principal{NodeID: "node-b", Sender: "trainer"}) {
			t.Fatalf("status of node-a to trainer of node-b: %+v", st)
		}
		var m localapi.Membership
		if err := a.cli(t).Call(ctx, localapi.ServiceMembership, localapi.MethodList, nil, &m); err != nil {
			t.Fatal(err)
		}
		if len(m.Machines) != 2 || m.Machines[1].NodeID != "node-b" || m.Machines[1].BootID != b.BootID() {
			t.Errorf("node-a's machines after node-b's call: %+v", m.Machines)
		}
	})
	t.Run("the command line of another machine calls across", func(t *testing.T) {
		var st localapi.Status
		if err := b.cli(t).Do(ctx, toA, &st); err != nil {
			t.Fatal(err)
		}
		if st.Caller != (localapi.Principal{NodeID: "node-b", Sender: localapi.CLISender}) {
			t.Fatalf("caller %+v", st.Caller)
		}
	})
	t.Run("an instance the launch does not place", func(t *testing.T) {
		in := b.startInstance(t, "intruder")
		defer in.exit(t)
		c := b.client(t, b.signer(t, "intruder", in.key, 0))
		wantRejected(t, send(t, c, toA), checkPlacement, `the launch "demo" places no instance "intruder"`)
	})
	t.Run("an instance the launch places on another machine", func(t *testing.T) {
		c3 := startDaemon(t, fl.state(t, "node-c", false), nil)
		applyLaunch(t, c3, l)
		in := c3.startInstance(t, "trainer")
		defer in.exit(t)
		c := c3.client(t, c3.signer(t, "trainer", in.key, 0))
		wantRejected(t, send(t, c, localapi.Call{Node: "node-a", Address: a.fedAddr, Service: localapi.ServiceStatus, Method: localapi.MethodGet}),
			checkPlacement, `places instance "trainer" on node "node-b", not on node "node-c"`)
	})

	fed, err := localapi.DialFederation(a.fedAddr, insecureTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer fed.Close()
	cliKey := b.cliKey(t)
	good := proofSpec{st: stB, namespace: testTD, bootKey: newKey(t), sender: localapi.CLISender, senderKey: cliKey.Public().(ed25519.PublicKey)}
	call := func(t *testing.T, env *callsig.Envelope, p *callsig.MachineProof) *localv1.CallReply {
		t.Helper()
		r, err := fed.Call(ctx, env, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	envB := func(t *testing.T) *callsig.Envelope {
		return remoteEnvelope(t, a, testTD, "node-a", "node-b", localapi.CLISender, cliKey)
	}

	t.Run("a hand-made proof of node-b's key is taken", func(t *testing.T) {
		wantOK(t, call(t, envB(t), good.build(t)))
	})
	t.Run("a call of another machine with no proof", func(t *testing.T) {
		wantRejected(t, call(t, envB(t), nil), callsig.CheckMachineProof, "a call of another machine needs a machine proof")
	})
	t.Run("a call of another machine with no signature", func(t *testing.T) {
		env := envB(t)
		env.Signature = nil
		wantRejected(t, call(t, env, good.build(t)), callsig.CheckNoSignature)
	})
	t.Run("a forged endorsement", func(t *testing.T) {
		p := good
		p.endorseWith = newKey(t)
		wantRejected(t, call(t, envB(t), p.build(t)), callsig.CheckMachineProof, "does not verify with the boot key of the statement: it is forged")
	})
	t.Run("a statement for another namespace", func(t *testing.T) {
		p := good
		p.namespace = "other-ns"
		wantRejected(t, call(t, envB(t), p.build(t)), callsig.CheckMachineProof, `the boot statement is for namespace "other-ns", not this daemon's "fleet.test"`)
	})
	t.Run("a statement naming another node than the certificate", func(t *testing.T) {
		p := good
		p.statementNode = "node-c"
		wantRejected(t, call(t, envB(t), p.build(t)), callsig.CheckMachineProof, `the boot statement names node "node-c", but the certificate is node "node-b"`)
	})
	t.Run("a certificate of another trust domain", func(t *testing.T) {
		p := good
		p.st = newFleet(t, "elsewhere.test").state(t, "node-b", false)
		wantRejected(t, call(t, envB(t), p.build(t)), callsig.CheckMachineProof, "does not verify against this daemon's CA")
	})
	t.Run("a call that gives another sender than the proof endorses", func(t *testing.T) {
		inst := newKey(t)
		p := good
		p.sender, p.senderKey = "trainer", inst.Public().(ed25519.PublicKey)
		wantRejected(t, call(t, envB(t), p.build(t)), callsig.CheckMachineProof, `the call gives sender "nodetrust-cli", but its machine proof endorses "trainer"`)
	})
	t.Run("a call naming another receiver", func(t *testing.T) {
		env := remoteEnvelope(t, a, testTD, "node-z", "node-b", localapi.CLISender, cliKey)
		wantRejected(t, call(t, env, good.build(t)), checkKeyExpr, `it names receiver "node-z", but this daemon is node "node-a"`)
	})
	t.Run("a call naming another sender node than the proof", func(t *testing.T) {
		env := remoteEnvelope(t, a, testTD, "node-a", "node-c", localapi.CLISender, cliKey)
		wantRejected(t, call(t, env, good.build(t)), checkKeyExpr, `it names sender node "node-c", but the call comes from node "node-b"`)
	})
	t.Run("a replayed call of another machine", func(t *testing.T) {
		env, p := envB(t), good.build(t)
		wantOK(t, call(t, env, p))
		wantRejected(t, call(t, env, p), callsig.CheckReplay)
	})
	t.Run("a daemon with no machine certificate takes no call of another machine", func(t *testing.T) {
		bare := startDaemon(t, fl.state(t, "node-n", true), nil)
		b, _ := envB(t).MarshalBinary()
		pb, _ := good.build(t).MarshalBinary()
		r, err := federationServer{s: bare.Server}.Call(ctx, &localv1.CallRequest{Envelope: b, MachineProof: pb})
		if err != nil {
			t.Fatal(err)
		}
		wantRejected(t, r, callsig.CheckMachineProof, "this daemon has no machine CA and trust domain")
		// Nor can it prove its own calls.
		err = bare.cli(t).Do(ctx, localapi.Call{Node: "node-a", Address: a.fedAddr, Service: localapi.ServiceStatus, Method: localapi.MethodGet}, nil)
		if err == nil || !strings.Contains(err.Error(), "no machine certificate, so other machines refuse its calls") {
			t.Errorf("relay from a daemon with no machine certificate: %v", err)
		}
	})
	t.Run("a relay to a daemon that is not the node called", func(t *testing.T) {
		err := b.cli(t).Do(ctx, localapi.Call{Node: "node-x", Address: a.fedAddr, Service: localapi.ServiceStatus, Method: localapi.MethodGet}, nil)
		if err == nil || !strings.Contains(err.Error(), "authentication handshake failed") || !strings.Contains(err.Error(), "check the address of") {
			t.Errorf("relay to the wrong daemon: %v", err)
		}
	})
	t.Run("a probe of another machine needs no proof", func(t *testing.T) {
		env := envB(t)
		env.Kind, env.Signature = callsig.KindProbe, nil
		r := call(t, env, nil)
		wantOK(t, r)
		var p localapi.ProbeReply
		if err := json.Unmarshal(r.GetPayload(), &p); err != nil || !p.Present {
			t.Errorf("probe reply %s: %v", r.GetPayload(), err)
		}
	})
}
