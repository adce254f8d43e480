package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/bcd/identity"
)

// waitPast waits until the wall clock is past t: a certificate's expiry has
// no signal but time itself.
func waitPast(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d + 100*time.Millisecond)
	}
}

func TestACertificateThatExpiredWhileTheNodeWasOffIsAnsweredWithTheWayBack(t *testing.T) {
	cp := startControlPlane(t, "node_cert_lifetime = \"2s\"\n")
	m := newMachine(t, cp, "", "")
	node := m.join(t, cp)
	st, err := identity.LoadState(m.dataDir, identity.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPast(st.Leaf.NotAfter) // the node is off meanwhile
	const wayBack = "join again: bcd join --reset --yes < token.txt, with a fresh token"

	t.Run("join and doctor say the certificate expired and give the way back", func(t *testing.T) {
		checkDeadIdentity(t, m, "this machine is joined as "+node+", but its certificate expired at", `the node certificate expired at`, wayBack)
	})
	t.Run("bcd node stops at once with the way back", func(t *testing.T) {
		a := startAgent(t, m)
		if code := a.wait(t, 30*time.Second); code != 1 {
			t.Fatalf("bcd node on an expired certificate exited %d:\n%s", code, a.log)
		}
		if log := a.log.String(); !strings.Contains(log, "this node's certificate expired at") || !strings.Contains(log, wayBack) {
			t.Errorf("bcd node on an expired certificate:\n%s", log)
		}
	})
	t.Run("the way back, done literally, works", func(t *testing.T) {
		tok := cp.token(t, "--role", "worker")
		r := run(t, tok, m.env(), "bcd", "join", "--config", m.cfg, "--reset", "--yes")
		if r.code != 0 || joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout))) == nil {
			t.Errorf("bcd join --reset --yes < token.txt: %s", r)
		}
	})
}

func TestPermissiveFoldersAreRefusedWithTheCommandToRun(t *testing.T) {
	cp := startControlPlane(t, "")

	t.Run("bcd join refuses a data directory others may write", func(t *testing.T) {
		m := newMachine(t, cp, "", "")
		if err := os.MkdirAll(m.dataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(m.dataDir, 0o777); err != nil {
			t.Fatal(err)
		}
		r := run(t, cp.token(t, "--role", "worker"), m.env(), "bcd", "join", "--config", m.cfg)
		if r.code != 1 || !strings.Contains(r.stderr, "the data directory "+m.dataDir+" is writable by others (mode 0777)") ||
			!strings.Contains(r.stderr, "run: chmod 0700 "+m.dataDir) {
			t.Errorf("join into a 0777 data directory: %s", r)
		}
		if _, err := os.Stat(filepath.Join(m.dataDir, "identity.json")); !os.IsNotExist(err) {
			t.Errorf("an identity was written into it: %v", err)
		}
		doc := run(t, "", nil, "bcd", "doctor", "--config", m.cfg)
		if doc.code != 1 || !regexp.MustCompile(`fail +permissions +the data directory .* is writable by others`).MatchString(doc.stdout) ||
			!strings.Contains(doc.stdout, "→ chmod 0700 "+m.dataDir) {
			t.Errorf("doctor on a 0777 data directory: %s", doc)
		}
		// After the chmod the same join works.
		if err := os.Chmod(m.dataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		m.join(t, cp)
	})

	t.Run("bcd join and node refuse a data directory another user owns", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("only root can give a folder to another user")
		}
		m := newMachine(t, cp, "", "")
		m.join(t, cp)
		if err := os.Chown(m.dataDir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		r := run(t, "", m.env(), "bcd", "join", "--config", m.cfg)
		if r.code != 1 || !strings.Contains(r.stderr, "not by root or root") || !strings.Contains(r.stderr, "run: chown root "+m.dataDir) {
			t.Errorf("join with a foreign data directory: %s", r)
		}
		a := startAgent(t, m)
		if code := a.wait(t, 30*time.Second); code != 1 || !strings.Contains(a.log.String(), "chown root "+m.dataDir) {
			t.Errorf("bcd node with a foreign data directory: exit %d\n%s", code, a.log)
		}
	})

	t.Run("bcd node refuses a credentials folder others may write", func(t *testing.T) {
		m := newMachine(t, cp, "", "")
		m.join(t, cp)
		creds := filepath.Join(m.dataDir, "credentials")
		if err := os.Mkdir(creds, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(creds, 0o777); err != nil {
			t.Fatal(err)
		}
		a := startAgent(t, m)
		if code := a.wait(t, 30*time.Second); code != 1 || !strings.Contains(a.log.String(), "the credentials folder "+creds+" is writable by others") {
			t.Errorf("bcd node with a 0777 credentials folder: exit %d\n%s", code, a.log)
		}
	})

	t.Run("a token file others may read is used with a warning", func(t *testing.T) {
		m := newMachine(t, cp, "", "")
		tokenFile := filepath.Join(t.TempDir(), "join-token")
		if err := os.WriteFile(tokenFile, []byte(cp.token(t, "--role", "worker")), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(tokenFile, 0o644); err != nil {
			t.Fatal(err)
		}
		r := run(t, "", m.env(), "bcd", "join", "--config", m.cfg, "--token-file", tokenFile)
		if r.code != 0 || !strings.Contains(r.stderr, "bcd: warning: the join token file "+tokenFile+" is readable by others (mode 0644): chmod 600 "+tokenFile) {
			t.Errorf("join with a 0644 token file: %s", r)
		}
		// doctor looks at the install script's token file beside config.toml.
		beside := filepath.Join(filepath.Dir(m.cfg), "join-token")
		if err := os.WriteFile(beside, []byte("spent"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(beside, 0o644); err != nil {
			t.Fatal(err)
		}
		doc := run(t, "", nil, "bcd", "doctor", "--config", m.cfg)
		if doc.code != 3 || !regexp.MustCompile(`warn +permissions +the join token `+regexp.QuoteMeta(beside)+` is readable by others`).MatchString(doc.stdout) {
			t.Errorf("doctor with a 0644 token file: %s", doc)
		}
	})

	t.Run("fleetd init refuses a PKI folder others may write", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "pki")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		r := run(t, "", nil, "fleetd", "init", "--dir", dir, "--trust-domain", "t.example", "--server-name", "fleetd.test")
		if r.code != 1 || !strings.Contains(r.stderr, "the PKI folder "+dir+" is writable by others (mode 0777)") || !strings.Contains(r.stderr, "chmod 0700 "+dir) {
			t.Errorf("fleetd init into a 0777 folder: %s", r)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("fleetd init wrote into it: %v", entries)
		}
	})
}

func TestACertificateThatExpiresWhileTheDiskIsFullEndsTheNodeWithTheWayBack(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test mounts a small tmpfs as the data directory and needs root")
		}
		t.Skip("mounting a small tmpfs needs root")
	}
	// The first renewal is due at 90% of the certificate's 10 s (8 s and
	// the 2 s it is backdated): seven seconds to fill the disk in.
	cp := startControlPlane(t, "node_cert_lifetime = \"8s\"\n")
	m := newMachine(t, cp, "", "tpm = \"off\"\n[renewal]\nfraction = 0.9\nbackoff_min = \"200ms\"\nbackoff_max = \"500ms\"\n")
	if err := os.MkdirAll(m.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", m.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v\n%s", m.dataDir, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", m.dataDir).Run() })
	node := m.join(t, cp)
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)
	// The disk fills up while the node runs: nothing more can be written,
	// a renewal's next key least of all.
	fill, err := os.Create(filepath.Join(m.dataDir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := fill.Write(buf); err != nil {
			break
		}
	}
	fill.Close()

	a.waitFor(t, regexp.MustCompile(`msg="renewal failed" .*no space left on device`), 30*time.Second)
	if code := a.wait(t, 60*time.Second); code != 1 {
		t.Fatalf("bcd node exited %d, want 1:\n%s", code, a.log)
	}
	log := a.log.String()
	if !strings.Contains(log, "this node's certificate expired at") || !strings.Contains(log, "no space left on device") ||
		!strings.Contains(log, "join again: bcd join --reset --yes < token.txt") {
		t.Errorf("bcd node did not end with the way back:\n%s", log)
	}
	// It tried a few times, not forever: the retries stop at the expiry.
	if n := strings.Count(log, `msg="renewal failed"`); n == 0 || n > 40 {
		t.Errorf("%d failed renewals logged", n)
	}
	show := run(t, "", nil, "fleetd", "nodes", "show", node, "--config", cp.config, "--json")
	if show.code != 0 {
		t.Errorf("nodes show: %s", show)
	}
}

func TestAMachineWithoutDMIIdentityIsToldAndCanBeNamed(t *testing.T) {
	cp := startControlPlane(t, "")
	vm := newMachine(t, cp, "", "") // no product UUID, no serial
	tok := cp.token(t, "--role", "worker")
	r := run(t, tok, vm.env(), "bcd", "join", "--config", vm.cfg)
	mm := joinedRE.FindStringSubmatch(r.stdout)
	if r.code != 0 || mm == nil {
		t.Fatalf("join: %s", r)
	}
	node := mm[1]
	if !strings.Contains(r.stderr, "this machine reports no DMI product UUID or serial") ||
		!strings.Contains(r.stderr, "fleetd token create --node-id "+node+" --allow-reclaim") {
		t.Errorf("the join did not say the machine cannot be recognised: %s", r)
	}

	t.Run("a plain token after --reset makes a new node, as the warning said", func(t *testing.T) {
		r := run(t, cp.token(t, "--role", "worker", "--allow-reclaim"), vm.env(), "bcd", "join", "--config", vm.cfg, "--reset", "--yes")
		mm := joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
		if r.code != 0 || mm == nil || mm[1] == node {
			t.Fatalf("rejoin with a plain token: %s", r)
		}
	})
	t.Run("a token naming the node brings it back", func(t *testing.T) {
		tok := cp.token(t, "--role", "worker", "--node-id", node, "--allow-reclaim")
		r := run(t, tok, vm.env(), "bcd", "join", "--config", vm.cfg, "--reset", "--yes")
		mm := joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
		if r.code != 0 || mm == nil || mm[1] != node {
			t.Fatalf("rejoin with a token naming %s: %s", node, r)
		}
	})
	t.Run("bcd join --node-id names a new node", func(t *testing.T) {
		other := newMachine(t, cp, "", "")
		r := run(t, cp.token(t, "--role", "worker"), other.env(), "bcd", "join", "--config", other.cfg, "--node-id", "vm-named-7")
		if mm := joinedRE.FindStringSubmatch(r.stdout); r.code != 0 || mm == nil || mm[1] != "vm-named-7" {
			t.Fatalf("join --node-id: %s", r)
		}
	})
	t.Run("a machine with a DMI product UUID hears nothing of it", func(t *testing.T) {
		hw := newMachine(t, cp, "6a1f5c1e-0000-4000-8000-0000000000d1", "")
		r := run(t, cp.token(t, "--role", "worker"), hw.env(), "bcd", "join", "--config", hw.cfg)
		if r.code != 0 || strings.Contains(r.stderr, "DMI") {
			t.Errorf("join of a machine with DMI identity: %s", r)
		}
	})
}
