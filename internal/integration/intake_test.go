package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/pkcs11key/softhsmtest"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// bcd intake against fleetd serve on swtpm (docs/install.md, "Intake"):
// the declared machine gets its LDevID and LAK certificate under the DevID
// CA, stored in its data directory; another (trusted) TPM claiming the same
// device is refused with what to do, the reason in fleetd's log.
func TestIntakeWithTheRealBinaries(t *testing.T) {
	sw, other := tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t)
	// Both EK certificates are trusted: the other TPM is a genuine one, not
	// the one the declaration binds.
	cp := startControlPlane(t, ekRootsConfig(t, sw, other))
	declarer := cp.credential(t, "alice", "declarer")
	cp.apply(t, declarer, inventoryFile(decl{"web-01", uuid1, "worker", ekPin(t, sw)}))
	devidCA, err := pki.ReadCerts(filepath.Join(cp.dir, "pki", pki.DevIDCACertFile))
	if err != nil {
		t.Fatal(err)
	}
	nodeCA, err := pki.ReadCerts(filepath.Join(cp.dir, "pki", pki.NodeCACertFile))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the declared machine gets its device certificates", func(t *testing.T) {
		m := tpmMachine(t, cp, uuid1, sw, "")
		r := run(t, "", m.env(), "bcd", "intake", "--config", m.cfg)
		if r.code != 0 || !strings.Contains(r.stdout, "intake passed as web-01") {
			t.Fatalf("bcd intake: %s", r)
		}
		dir := filepath.Join(m.dataDir, "devid")
		for _, name := range []string{"ldevid.crt", "lak.crt"} {
			chain, err := pki.ReadCerts(filepath.Join(dir, name))
			if err != nil || len(chain) != 2 {
				t.Fatalf("%s: %d certificates, %v", name, len(chain), err)
			}
			if err := chain[0].CheckSignatureFrom(devidCA[0]); err != nil {
				t.Errorf("%s is not signed by the DevID CA: %v", name, err)
			}
			if chain[0].CheckSignatureFrom(nodeCA[0]) == nil {
				t.Errorf("%s is signed by the node CA", name)
			}
			info, err := pki.ParseDeviceCert(chain[0])
			if err != nil || info.Device != "web-01" || info.ProductUUID != uuid1 {
				t.Errorf("%s says %+v, %v", name, info, err)
			}
		}
		if st, err := os.Stat(filepath.Join(dir, "devid.keyrec")); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("devid.keyrec: %v %v", st, err)
		}
		if !strings.Contains(cp.log.String(), `msg=intake node_id=web-01`) {
			t.Errorf("fleetd did not log the intake:\n%s", tail(cp.log.String(), 20))
		}
	})

	t.Run("another TPM claiming the device is refused", func(t *testing.T) {
		before := len(cp.log.String())
		m := tpmMachine(t, cp, uuid1, other, "")
		r := run(t, "", m.env(), "bcd", "intake", "--config", m.cfg)
		if r.code != 1 || !strings.Contains(r.stderr, "Intake refused") || !strings.Contains(r.stderr, "bcd intake again") {
			t.Fatalf("bcd intake with another TPM: %s", r)
		}
		if strings.Contains(r.stderr, "other EKs") {
			t.Errorf("the reason reached the machine: %s", r.stderr)
		}
		if logged := cp.log.String()[before:]; !strings.Contains(logged, "whose binding names other EKs") {
			t.Errorf("fleetd did not log why:\n%s", tail(logged, 20))
		}
		if _, err := os.Stat(filepath.Join(m.dataDir, "devid")); !os.IsNotExist(err) {
			t.Errorf("a refused intake left devid/: %v", err)
		}
	})
}

// With the DevID CA's key in a PKCS#11 token (SoftHSM2), fleetd signs an
// intake's certificates through the token: no devid-ca.key file exists.
func TestIntakeSignsWithTheDevIDCAInAToken(t *testing.T) {
	hsm := softhsmtest.New(t)
	hsm.InitToken(t, "fleet")
	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlaneWith(t, cpOptions{
		extraConfig: pkcs11Config(hsm),
		initArgs:    []string{"--pkcs11", "pkcs11:token=fleet"},
		env:         []string{hsm.Env()},
	})
	pkiDir := filepath.Join(cp.dir, "pki")
	if _, err := os.Stat(filepath.Join(pkiDir, pki.DevIDCAKeyFile)); !os.IsNotExist(err) {
		t.Fatalf("%s exists (%v): the DevID CA's key should be in the token", pki.DevIDCAKeyFile, err)
	}
	declarer := cp.credential(t, "alice", "declarer")
	cp.apply(t, declarer, inventoryFile(decl{"web-01", uuid1, "worker", ekPin(t, sw)}))
	m := tpmMachine(t, cp, uuid1, sw, "")
	if r := run(t, "", m.env(), "bcd", "intake", "--config", m.cfg); r.code != 0 {
		t.Fatalf("bcd intake: %s", r)
	}
	devidCA, err := pki.ReadCerts(filepath.Join(pkiDir, pki.DevIDCACertFile))
	if err != nil {
		t.Fatal(err)
	}
	ldevid, err := pki.ReadCerts(filepath.Join(m.dataDir, "devid", "ldevid.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ldevid[0].CheckSignatureFrom(devidCA[0]); err != nil {
		t.Errorf("the LDevID is not signed by the DevID CA in the token: %v", err)
	}
}
