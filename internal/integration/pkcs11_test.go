package integration

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/fleetd/pkcs11key/softhsmtest"
	"github.com/nodetrust/nodetrust/pki"
)

// pkcs11Config is the [pkcs11] section naming a SoftHSM2's module and PIN file.
func pkcs11Config(hsm *softhsmtest.SoftHSM) string {
	return "[pkcs11]\nmodule = \"" + softhsmtest.Module + "\"\npin_file = \"" + hsm.PINFile + "\"\n"
}

// keyFiles lists the private key files (*.key) under dir, relative to it.
func keyFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, ".key") {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

var (
	renewalUnavailableRE = regexp.MustCompile(`msg="renewal failed" .*signing key is unavailable`)
	joinUnavailableRE    = regexp.MustCompile(`msg="join failed, retrying" .*control plane unavailable: join \(request \S+\): the control plane's signing key is unavailable`)
	joinedLineRE         = regexp.MustCompile(`^joined as (\S+) `)
)

// TestPKCS11KeysSignJoinsAndRenewalsAndSurviveTheTokenGoingAway runs the
// real binaries with the CA and JoinService keys made inside a SoftHSM2
// token: init writes no private key file for them, a token join and the
// renewals are signed by the token, and when the token goes away joins
// and renewals fail with UNAVAILABLE and come back when it returns.
func TestPKCS11KeysSignJoinsAndRenewalsAndSurviveTheTokenGoingAway(t *testing.T) {
	hsm := softhsmtest.New(t)
	tok := hsm.InitToken(t, "fleet")
	cp := startControlPlaneWith(t, cpOptions{
		extraConfig: "node_cert_lifetime = \"20s\"\nrenewal_limit = 1000\n" + pkcs11Config(hsm),
		initArgs:    []string{"--pkcs11", "pkcs11:token=fleet", "--pkcs11", "serving-ca=pkcs11:token=fleet"},
		env:         []string{hsm.Env()},
	})
	pkiDir := filepath.Join(cp.dir, "pki")

	t.Run("init wrote no private key file for the keys it made in the token", func(t *testing.T) {
		// The serving key signs every TLS handshake and stays a file by
		// default; the join encryption key and the owner's credential are
		// files (docs/pki.md says why).
		want := []string{"admin/owner.key", "join-encryption.key", "serving.key"}
		if got := keyFiles(t, pkiDir); !slices.Equal(got, want) {
			t.Errorf("private key files %v, want only %v", got, want)
		}
		for _, use := range []pki.KeyUse{pki.KeyRootCA, pki.KeyNodeCA, pki.KeyDevIDCA, pki.KeyServingCA, pki.KeyJoinSigning, pki.KeyAdminCA} {
			ref, err := pki.ReadKeyRef(filepath.Join(pkiDir, use.RefFile()))
			if err != nil || !strings.HasPrefix(ref, "pkcs11:token=fleet;object=nodetrust-"+string(use)+";id=") || strings.Contains(ref, softhsmtest.PIN) {
				t.Errorf("%s = %q, %v", use.RefFile(), ref, err)
			}
		}
		if n := tok.ObjectFiles(t); n != 12 {
			t.Errorf("the token holds %d objects, want 12 (6 key pairs)", n)
		}
	})

	t.Run("pki show says each key is in the token and --check signs with it", func(t *testing.T) {
		r := run(t, "", []string{hsm.Env()}, "fleetd", "pki", "show", "--config", cp.config, "--check", "--json")
		if r.code != 0 {
			t.Fatalf("fleetd pki show: %s", r)
		}
		var rows []struct{ Key, Where, Check string }
		if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
			t.Fatal(err)
		}
		if len(rows) != len(pki.KeyUses) {
			t.Fatalf("%d rows, want %d", len(rows), len(pki.KeyUses))
		}
		for _, row := range rows {
			inToken := strings.HasPrefix(row.Where, "pkcs11:token=fleet;")
			if inToken != (row.Key != "serving") || row.Check != "ok" {
				t.Errorf("%s: where %q, check %q", row.Key, row.Where, row.Check)
			}
		}
	})

	renewal := "[renewal]\nfraction = 0.1\nbackoff_min = \"300ms\"\nbackoff_max = \"1s\"\n"
	m := newMachine(t, cp, "", renewal)
	m.join(t, cp)
	t.Run("the node's certificate is signed by the node CA in the token", func(t *testing.T) {
		st, err := identity.LoadState(m.dataDir, identity.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodeCA, err := pki.ReadCerts(filepath.Join(pkiDir, pki.NodeCACertFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Leaf.CheckSignatureFrom(nodeCA[0]); err != nil {
			t.Errorf("the joined certificate does not verify under node-ca.crt: %v", err)
		}
	})
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)
	a.waitFor(t, renewedRE, 30*time.Second)

	tok.Remove(t)
	restored := false
	t.Cleanup(func() {
		if !restored {
			tok.Restore(t)
		}
	})
	m2 := newMachine(t, cp, "", "")
	waiting := startProc(t, strings.NewReader(cp.token(t, "--role", "worker")), m2.env(), "join", "--config", m2.cfg)
	t.Run("with the token gone, renewals and joins fail with UNAVAILABLE", func(t *testing.T) {
		a.waitFor(t, renewalUnavailableRE, 30*time.Second)
		waiting.waitFor(t, joinUnavailableRE, 30*time.Second)
		for _, want := range []string{`msg="PKCS#11 token unavailable: joins and renewals fail with UNAVAILABLE until it returns`, `pkcs11_token="pkcs11:token=fleet"`, `msg="signing failed"`} {
			if !strings.Contains(cp.log.String(), want) {
				t.Errorf("fleetd's log does not say %s:\n%s", want, cp.log)
			}
		}
	})

	tok.Restore(t)
	restored = true
	t.Run("when it returns, the waiting join completes with its token and the node renews again", func(t *testing.T) {
		waiting.waitFor(t, joinedLineRE, 60*time.Second)
		if code := waiting.wait(t, 30*time.Second); code != 0 {
			t.Errorf("bcd join exited %d:\n%s", code, waiting.log)
		}
		a.waitFor(t, renewedRE, 30*time.Second)
		if !strings.Contains(cp.log.String(), `msg="PKCS#11 token answers again`) {
			t.Errorf("fleetd's log does not say the token answers again:\n%s", cp.log)
		}
	})
}

// initInToken makes a SoftHSM2 token "fleet" and, in a new folder, a
// fleetd.toml naming it and a PKI whose default keys are in it. It returns
// the folder, the config and the environment that finds the token.
func initInToken(t *testing.T) (hsm *softhsmtest.SoftHSM, dir, cfg string, env []string) {
	t.Helper()
	hsm = softhsmtest.New(t)
	hsm.InitToken(t, "fleet")
	dir = t.TempDir()
	cfg = filepath.Join(dir, "fleetd.toml")
	if err := os.WriteFile(cfg, []byte("pki_dir = \"pki\"\ndata_dir = \"data\"\nlisten = \"127.0.0.1:0\"\n"+pkcs11Config(hsm)), 0o600); err != nil {
		t.Fatal(err)
	}
	env = []string{hsm.Env()}
	if r := run(t, "", env, "fleetd", "init", "--config", cfg, "--trust-domain", "test.nodetrust.example", "--server-name", "fleetd.test", "--pkcs11", "pkcs11:token=fleet"); r.code != 0 {
		t.Fatalf("fleetd init: %s", r)
	}
	return hsm, dir, cfg, env
}

func TestPKCS11WrongPINStopsServeWithTheWayBack(t *testing.T) {
	hsm, _, cfg, env := initInToken(t)
	if err := os.WriteFile(hsm.PINFile, []byte("0000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "", env, "fleetd", "serve", "--config", cfg)
	if r.code != 1 {
		t.Fatalf("fleetd serve with a wrong PIN: %s", r)
	}
	for _, want := range []string{"the token refused the PIN", "CKR_PIN_INCORRECT", "write the token's user PIN into " + hsm.PINFile, "does not retry"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("fleetd serve's error does not say %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "0000") || strings.Contains(r.stderr, softhsmtest.PIN) {
		t.Errorf("fleetd serve's error shows a PIN:\n%s", r.stderr)
	}
}

// TestPKCS11ReleaseBuildRefusesTokenKeysByName builds fleetd as release
// builds are (CGO_ENABLED=0) and checks that it refuses a PKI whose keys are
// in a token, naming the key and the way back, instead of starting without
// them.
func TestPKCS11ReleaseBuildRefusesTokenKeysByName(t *testing.T) {
	hsm, dir, cfg, env := initInToken(t)
	release := filepath.Join(dir, "fleetd-release")
	build := exec.Command("go", "build", "-o", release, "github.com/nodetrust/nodetrust/cmd/fleetd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build fleetd with CGO_ENABLED=0: %v\n%s", err, out)
	}
	runRelease := func(args ...string) result {
		cmd := exec.Command(release, args...)
		cmd.Env = append(baseEnv(), env...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return result{stdout: out.String(), stderr: errb.String(), code: code}
	}
	r := runRelease("serve", "--config", cfg)
	for _, want := range []string{"open the node CA key pkcs11:token=fleet;object=nodetrust-node-ca;", "built without cgo (CGO_ENABLED=0)", "use a fleetd built with CGO_ENABLED=1"} {
		if r.code != 1 || !strings.Contains(r.stderr, want) {
			t.Errorf("release fleetd serve does not say %q: %s", want, r)
		}
	}
	r = runRelease("init", "--dir", filepath.Join(dir, "pki2"), "--trust-domain", "test.nodetrust.example", "--server-name", "fleetd.test", "--pkcs11", hsm.URI(&softhsmtest.Token{Label: "fleet"}))
	if r.code != 1 || !strings.Contains(r.stderr, "built without cgo") {
		t.Errorf("release fleetd init --pkcs11: %s", r)
	}
	if _, err := os.Stat(filepath.Join(dir, "pki2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused init left %s: %v", filepath.Join(dir, "pki2"), err)
	}
}
