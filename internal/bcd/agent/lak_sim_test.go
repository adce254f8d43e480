//go:build tpmsim

package agent_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// After an install, bcd join --attestor tpm joins with the LAK of
// <data_dir>/devid: the identity's AK is the LAK (so the boot checks and
// renewals quote with it), and fleetd keeps the LAK's name.
func TestSimTPMJoinAfterIntakeUsesTheLAK(t *testing.T) {
	tp, _ := tpmtest.OpenSim(t)
	ek, err := tp.EK(t.Context(), tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	ekPin, err := attest.EKPin(ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t, func(c *service.Config) { c.AutoProvision = true })
	const uuid = "00000000-0000-4000-8000-0000000000cf"
	declareBound(t, cp, "web-05", uuid, ekPin)
	dir := t.TempDir()
	claims := hwclaims.Claims{ProductUUID: uuid, Hostname: "web-05"}
	if _, err := agent.Intake(t.Context(), agent.IntakeConfig{Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, DataDir: dir,
		TPM: agent.Direct(tp), Claims: claims}); err != nil {
		t.Fatalf("intake: %v", err)
	}
	lakCerts, err := pki.ReadCerts(filepath.Join(agent.IntakeDir(dir), agent.LAKCertFile))
	if err != nil {
		t.Fatal(err)
	}
	lak, err := pki.ParseDeviceCert(lakCerts[0])
	if err != nil {
		t.Fatal(err)
	}
	jc := agent.JoinConfig{
		Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, JWK: cp.jwk, DataDir: dir,
		Attestor: "tpm", TPM: agent.Direct(tp), Claims: claims,
		Token: func() ([]byte, error) { return nil, nil },
	}

	// A lak.crt that certifies another key than lak.keyrec's is not sent.
	ldevid, err := os.ReadFile(filepath.Join(agent.IntakeDir(dir), agent.LDevIDFile))
	if err != nil {
		t.Fatal(err)
	}
	lakPEM, err := os.ReadFile(filepath.Join(agent.IntakeDir(dir), agent.LAKCertFile))
	if err != nil {
		t.Fatal(err)
	}
	writeLAK := func(b []byte) {
		if err := os.WriteFile(filepath.Join(agent.IntakeDir(dir), agent.LAKCertFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeLAK(ldevid)
	if _, err := agent.Join(t.Context(), jc); err == nil || !strings.Contains(err.Error(), "certifies another AK") {
		t.Fatalf("join with a lak.crt of another key: %v", err)
	}
	writeLAK(lakPEM)

	res, err := agent.Join(t.Context(), jc)
	if err != nil {
		t.Fatalf("join after the intake: %v", err)
	}
	identity.CloseSigner(res.State.Key)
	info, err := pki.ParseNodeCert(res.State.Leaf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(info.TPMAKName, lak.TPMAKName) {
		t.Fatalf("the node certificate names AK %x, want the LAK %x", info.TPMAKName, lak.TPMAKName)
	}
	rec, err := tpm.ParseKeyRecord(res.State.Identity.TPMAK)
	if err != nil {
		t.Fatal(err)
	}
	ak, err := tp.LoadAK(t.Context(), rec)
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	if !bytes.Equal(ak.Name(), lak.TPMAKName) {
		t.Fatalf("identity.json's AK record derives AK %x, want the LAK %x", ak.Name(), lak.TPMAKName)
	}
	n, err := cp.db.GetNode(t.Context(), res.State.Identity.NodeID)
	if err != nil || n.ID != "web-05" || !bytes.Equal(n.LAKName, lak.TPMAKName) {
		t.Fatalf("control plane's node %s: LAK %x, %v; want web-05 with the LAK %x", n.ID, n.LAKName, err, lak.TPMAKName)
	}
}
