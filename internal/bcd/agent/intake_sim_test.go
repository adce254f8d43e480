//go:build tpmsim

package agent_test

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// declareBound writes a declaration of name binding ekPin as a declarer,
// as fleetd inventory apply does.
func declareBound(t *testing.T, cp *controlPlane, name, uuid, ekPin string) {
	t.Helper()
	d := store.Declaration{Name: name, Serial: "SN-" + name, ProductUUID: uuid, Class: "worker", EKPins: []string{ekPin}, EKSource: inventory.SourceReceivingScan}
	p := inventory.MakePlan(nil, nil, []store.Declaration{d}, inventory.Writer{Name: "alice", Role: roles.Declarer}, cp.now(), "req", nil)
	if err := cp.db.ApplyInventory(t.Context(), store.InventoryWrite{Writes: p.Writes, Changes: p.Changes}); err != nil {
		t.Fatal(err)
	}
}

func TestSimIntakeStoresTheDeviceIdentity(t *testing.T) {
	tp, _ := tpmtest.OpenSim(t)
	ek, err := tp.EK(t.Context(), tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	ekPin, err := attest.EKPin(ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t)
	const uuid = "00000000-0000-4000-8000-0000000000cd"
	declareBound(t, cp, "web-02", uuid, ekPin)
	dir := t.TempDir()
	ic := agent.IntakeConfig{
		Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, DataDir: dir,
		TPM: agent.Direct(tp), Claims: hwclaims.Claims{ProductUUID: uuid, Hostname: "hookos"},
	}
	// An answer not signed by the pinned JoinService signing key is not
	// taken, and nothing is stored.
	wrong := ic
	wrong.Pins.JoinSigning = cp.pins.ServingCA
	if _, err := agent.Intake(t.Context(), wrong); err == nil || !strings.Contains(err.Error(), "join signing key pin") {
		t.Fatalf("intake with another join signing key pin: %v", err)
	}
	if _, err := os.Stat(agent.IntakeDir(dir)); !os.IsNotExist(err) {
		t.Fatalf("an intake answer under another pin left %s: %v", agent.IntakeDir(dir), err)
	}
	res, err := agent.Intake(t.Context(), ic)
	if err != nil {
		t.Fatalf("intake: %v", err)
	}
	if res.Session.Device != "web-02" || res.Session.ID == "" {
		t.Fatalf("session %+v", res.Session)
	}
	idir := agent.IntakeDir(dir)
	if st, err := os.Stat(idir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v %v, want a 0700 folder", idir, st, err)
	}
	for _, f := range []string{agent.LDevIDFile, agent.LAKCertFile, agent.DeviceKeyFile, agent.LAKKeyFile, agent.IntakeSessionFile} {
		if st, err := os.Stat(filepath.Join(idir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want a 0600 file", f, st, err)
		}
	}
	// The stored records derive the keys the certificates name again.
	readChain := func(name string) []*x509.Certificate {
		cs, err := pki.ReadCerts(filepath.Join(idir, name))
		if err != nil || len(cs) != 2 || !cs[1].Equal(cp.auth.DevIDCA) {
			t.Fatalf("%s: %d certificates, %v; want the leaf and the DevID CA", name, len(cs), err)
		}
		return cs
	}
	ldevid, lak := readChain(agent.LDevIDFile), readChain(agent.LAKCertFile)
	readRec := func(name string) tpm.KeyRecord {
		b, err := os.ReadFile(filepath.Join(idir, name))
		if err != nil {
			t.Fatal(err)
		}
		rec, err := tpm.ParseKeyRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	key, err := tp.LoadNodeKey(t.Context(), readRec(agent.DeviceKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	if !samePublic(key.Public(), ldevid[0].PublicKey) {
		t.Error("the stored device key record derives another key than the LDevID's")
	}
	ak, err := tp.LoadAK(t.Context(), readRec(agent.LAKKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	if !samePublic(ak.Public(), lak[0].PublicKey) {
		t.Error("the stored AK record derives another key than the LAK certificate's")
	}
	var sess agent.IntakeSession
	b, _ := os.ReadFile(filepath.Join(idir, agent.IntakeSessionFile))
	if err := json.Unmarshal(b, &sess); err != nil || sess != res.Session {
		t.Errorf("intake.json %s (%v), want %+v", b, err, res.Session)
	}
	stored, err := cp.db.GetIntakeSession(t.Context(), sess.ID)
	if err != nil || stored.Device != "web-02" || stored.EKPin != ekPin {
		t.Errorf("the control plane's session %+v, %v", stored, err)
	}
}

func TestSimIntakeOfAnUndeclaredMachineSaysWhatToDo(t *testing.T) {
	tp, _ := tpmtest.OpenSim(t)
	cp := startControlPlane(t)
	dir := t.TempDir()
	_, err := agent.Intake(t.Context(), agent.IntakeConfig{
		Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, DataDir: dir, TPM: agent.Direct(tp),
	})
	if err == nil || !strings.Contains(err.Error(), "Intake refused") || !strings.Contains(err.Error(), "declared") {
		t.Fatalf("intake of an undeclared machine: %v, want the refusal with what to do", err)
	}
	if _, err := os.Stat(agent.IntakeDir(dir)); !os.IsNotExist(err) {
		t.Errorf("a refused intake left %s: %v", agent.IntakeDir(dir), err)
	}
}

func samePublic(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}
