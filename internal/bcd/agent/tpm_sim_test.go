//go:build tpmsim

package agent_test

import (
	"crypto"
	"encoding/pem"
	"os"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The renewal loop with a TPM, on the in-process reference simulator
// (build tag tpmsim, cgo). The simulator is one per process: these tests
// do not run in parallel.

// loadTPM reads the identity in dir with the TPM's keys; the caller closes
// its key (identity.CloseSigner) or hands it to the agent.
func loadTPM(t *testing.T, dir string, tpmIface agent.TPM) *identity.State {
	t.Helper()
	st, err := identity.LoadState(dir, identity.LoadOptions{KeyLoader: agent.Keys{TPM: tpmIface}.Loader(t.Context())})
	if err != nil {
		t.Fatalf("LoadState: %v", err)
	}
	return st
}

// nodeKeyIsTPMRecord reports whether dir's node.key is a TPM key record.
func nodeKeyIsTPMRecord(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile(datadir.Layout(dir).Key())
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	return block != nil && block.Type == tpm.KeyRecordPEMType
}

// renewOnce runs the agent until its first journal entry, which must be a
// renewal, and stops it.
func renewOnce(t *testing.T, cp *controlPlane, dir string, c agent.NodeConfig, w *watch) {
	t.Helper()
	r := runNode(t, c)
	if e := w.next(t); e.kind != agent.JournalRenewed {
		t.Fatalf("journal %+v, want a renewal", e)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("RunNode = %v once stopped", err)
	}
}

func TestSimFileKeyMovesIntoTheTPMAtItsNextRenewal(t *testing.T) {
	cp := startControlPlane(t)
	dir, st := cp.joinNode(t, true)
	if st.Identity.KeyKind != identity.KeyKindFile || nodeKeyIsTPMRecord(t, dir) {
		t.Fatalf("joined without a TPM with key kind %s", st.Identity.KeyKind)
	}
	tp, _ := tpmtest.OpenSim(t)
	w := newWatch()
	c := cp.nodeConfig(dir, w)
	c.TPM = agent.Direct(tp)
	renewOnce(t, cp, dir, c, w)

	after := loadTPM(t, dir, c.TPM)
	defer identity.CloseSigner(after.Key)
	if after.Identity.KeyKind != identity.KeyKindTPM || !nodeKeyIsTPMRecord(t, dir) {
		t.Errorf("after the renewal: key kind %s, node.key a TPM record %t; want the key in the TPM", after.Identity.KeyKind, nodeKeyIsTPMRecord(t, dir))
	}
	if serialOf(after) == serialOf(st) {
		t.Error("identity.json still holds the joined certificate")
	}
}

func TestSimTPMJoinRenewsWithTheAK(t *testing.T) {
	tp, tr := tpmtest.OpenSim(t)
	mfr := tpmtest.NewManufacturer(t, "agent test TPM manufacturer", nil)
	mfr.Provision(t, tp, tr, tpm.EKRSA2048)
	verifier, err := attest.New(attest.Config{Roots: mfr.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t, func(c *service.Config) { c.EKVerifier = verifier })
	tpmIface := agent.Direct(tp)

	resp, err := cp.admin.CreateToken(t.Context(), &adminv1.CreateTokenRequest{Role: "gpu", Site: "rack7"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cp.shift.Store(int64(-50 * time.Minute)) // due for renewal at once
	res, err := agent.Join(t.Context(), agent.JoinConfig{
		Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, JWK: cp.jwk, DataDir: dir,
		Attestor: "tpm", TPM: tpmIface,
		Token:  func() ([]byte, error) { return []byte(resp.Token), nil },
		Claims: hwclaims.Claims{ProductUUID: "00000000-0000-4000-8000-00000000abcd", Hostname: "gpu-1"},
	})
	cp.shift.Store(0)
	if err != nil {
		t.Fatalf("tpm join: %v", err)
	}
	identity.CloseSigner(res.State.Key)
	joined := loadTPM(t, dir, tpmIface)
	info, err := pki.ParseNodeCert(joined.Leaf)
	if err != nil {
		t.Fatal(err)
	}
	if joined.Identity.Attestor != "tpm" || joined.Identity.KeyKind != identity.KeyKindTPM || len(joined.Identity.TPMAK) == 0 || len(info.TPMAKName) == 0 {
		t.Fatalf("tpm join: attestor %s, key %s, AK record %d bytes, leaf AK %x", joined.Identity.Attestor, joined.Identity.KeyKind, len(joined.Identity.TPMAK), info.TPMAKName)
	}
	node, err := cp.db.GetNode(t.Context(), joined.Identity.NodeID)
	if err != nil || node.Attestor != "tpm" || node.EKPin == "" {
		t.Fatalf("control plane's node %+v, %v; want a tpm node with its EK pin", node, err)
	}

	w := newWatch()
	c := cp.nodeConfig(dir, w)
	// The agent takes over the loaded state, as bcd's wiring does: the
	// simulator, like a TPM without a resource manager, has few object
	// slots.
	c.TPM, c.State = tpmIface, joined
	renewOnce(t, cp, dir, c, w)

	after := loadTPM(t, dir, tpmIface)
	defer identity.CloseSigner(after.Key)
	afterInfo, err := pki.ParseNodeCert(after.Leaf)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case serialOf(after) == serialOf(joined):
		t.Error("identity.json still holds the joined certificate")
	case string(afterInfo.TPMAKName) != string(info.TPMAKName):
		t.Errorf("renewed leaf names AK %x, want the join's %x", afterInfo.TPMAKName, info.TPMAKName)
	case after.Identity.KeyKind != identity.KeyKindTPM || !nodeKeyIsTPMRecord(t, dir):
		t.Errorf("renewed key kind %s, want tpm", after.Identity.KeyKind)
	case after.Key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(joined.Key.Public()):
		t.Error("the renewal kept the key")
	}
}

// TestSimTPMJoinECCOnly joins with a TPM whose only EK certificate is a
// high-range ECC P-256 one (0x01C00014, template H-2), as a vendor that
// certifies ECC alone ships it: the node picks the EK that certificate
// certifies, and the control plane trusts it, activates the credential
// and records that EK's pin.
func TestSimTPMJoinECCOnly(t *testing.T) {
	tp, tr := tpmtest.OpenSim(t)
	mfr := tpmtest.NewManufacturer(t, "ECC-only TPM manufacturer", nil)
	mfr.Provision(t, tp, tr, tpm.EKECCP256High)
	ek, err := tp.EK(t.Context(), tpm.EKECCP256High)
	if err != nil {
		t.Fatal(err)
	}
	wantPin, err := attest.EKPin(ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := attest.New(attest.Config{Roots: mfr.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t, func(c *service.Config) { c.EKVerifier = verifier })
	resp, err := cp.admin.CreateToken(t.Context(), &adminv1.CreateTokenRequest{Role: "gpu", Site: "rack7"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	res, err := agent.Join(t.Context(), agent.JoinConfig{
		Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, JWK: cp.jwk, DataDir: dir,
		Attestor: "tpm", TPM: agent.Direct(tp),
		Token:  func() ([]byte, error) { return []byte(resp.Token), nil },
		Claims: hwclaims.Claims{ProductUUID: "00000000-0000-4000-8000-00000000ecc1", Hostname: "ecc-1"},
	})
	if err != nil {
		t.Fatalf("tpm join with an ECC-only TPM: %v", err)
	}
	identity.CloseSigner(res.State.Key)
	node, err := cp.db.GetNode(t.Context(), res.State.Identity.NodeID)
	if err != nil || node.EKPin != wantPin {
		t.Fatalf("control plane's node %+v, %v; want the EK pin %s of the high-range P-256 EK", node, err, wantPin)
	}
}
