package service

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// FuzzBootEvidence feeds boot evidence from the network to the boot check
// of a node under a policy: whatever the bytes, they must not panic, and
// evidence no TPM signed must not change the node's state. The AK the
// node's certificate names is set to the one the evidence claims, so that
// the input reaches the quote check and the log parser behind it.
func FuzzBootEvidence(f *testing.F) {
	dir := f.TempDir()
	for _, class := range []string{"worker", "control-plane"} {
		if err := os.WriteFile(filepath.Join(dir, class+".toml"), []byte("class = \""+class+"\"\nsecure_boot = false\n"), 0o600); err != nil {
			f.Fatal(err)
		}
	}
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
	if err != nil {
		f.Fatal(err)
	}
	s := testServer(f, Config{BootPolicy: ps})
	n := joinNodes(f, s, 1)[0]
	var l tpmtest.EventLog
	l.SecureBootVariables(true, nil, nil, nil, nil)
	l.Separators(0, 1, 2, 3, 4, 5, 6, 7)
	pcrs := map[uint32][]byte{}
	for i, v := range l.PCRs() {
		pcrs[uint32(i)] = v
	}
	f.Add(mustMarshal(f, &gatewayv1.BootEvidence{Nonce: make([]byte, 32), Pcrs: pcrs, EventLog: l.Bytes(), QuoteAttest: []byte{0xff, 0x54, 0x43, 0x47}, QuoteSignature: []byte{0, 0x18}}))
	f.Add(mustMarshal(f, &gatewayv1.BootEvidence{Nonce: []byte("n"), Error: "quote failed"}))
	f.Add(mustMarshal(f, &gatewayv1.BootEvidence{AkPublic: []byte{0, 0x23, 0, 0x0b}, Pcrs: map[uint32][]byte{99: nil}}))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev gatewayv1.BootEvidence
		if proto.Unmarshal(data, &ev) != nil {
			return
		}
		caller := *n.caller
		if name, err := attest.AKName(ev.AkPublic); err == nil {
			caller.info.TPMAKName = name
		}
		out := s.bootCheck(ctx, &caller, &ev, ev.Nonce)
		if out.err == nil && out.verdict == nil {
			t.Fatal("a boot check with neither a verdict nor an error")
		}
		got, err := s.cfg.Store.GetNode(ctx, caller.node.ID)
		if err != nil || got.State != store.StateActive {
			t.Fatalf("after fuzzed evidence the node is %q (%v): unsigned evidence changed its state", got.State, err)
		}
	})
}
