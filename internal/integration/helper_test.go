package integration

import (
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// TestHelperModeJoinAndRenewal runs the unprivileged bcd node under
// [helper]: bcd helper (root) owns the swtpm, root's bcd join goes through
// it, writes the join record and hands the identity to the [helper] user,
// and that user's bcd node renews with AK-certified keys through the
// helper without opening the TPM.
func TestHelperModeJoinAndRenewal(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs as root; this test needs root to run bcd node as another user")
		}
		t.Skip("needs root: runs bcd helper as root and bcd node as the user nobody")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("the user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)

	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, "node_cert_lifetime = \"4s\"\n"+ekRootsConfig(t, sw))
	root := t.TempDir()
	// nobody walks down to its data directory.
	for p := root; p != "/" && p != "."; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o005 == 0 {
			_ = os.Chmod(p, fi.Mode().Perm()|0o005)
		}
	}
	hostconfig := filepath.Join(root, "hostconfig")
	sock := filepath.Join(root, "run", "helper.sock")
	m := newMachine(t, cp, "", "tpm = \""+sw.Spec()+"\"\n[helper]\nuser = \"nobody\"\nsocket = \""+sock+"\"\nhostconfig_dir = \""+hostconfig+"\"\n")
	for p := filepath.Dir(m.cfg); p != "/"; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil {
			_ = os.Chmod(p, fi.Mode().Perm()|0o005)
		}
	}
	_ = os.Chmod(m.cfg, 0o644)
	_ = os.MkdirAll(filepath.Dir(m.dataDir), 0o755)

	helper := startProc(t, nil, nil, "helper", "--config", m.cfg)
	helper.waitFor(t, regexpMust(`msg="bcd helper serving"`), 30*time.Second)

	tok := cp.token(t, "--role", "worker")
	r := run(t, tok, m.env(), "bcd", "join", "--config", m.cfg, "--attestor", "tpm")
	if r.code != 0 || !joinedRE.MatchString(r.stdout) {
		t.Fatalf("root's tpm join under [helper]: %s", r)
	}
	fi, err := os.Stat(filepath.Join(hostconfig, "join-response.pb"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the join record: %v %v", fi, err)
	}
	for _, name := range []string{"", "identity.json", "node.key"} {
		fi, err := os.Lstat(filepath.Join(m.dataDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid {
			t.Errorf("%s belongs to uid %d, want the [helper] user %d", filepath.Join(m.dataDir, name), st.Uid, uid)
		}
	}

	// bcd node as nobody: through the helper only.
	cmd := exec.Command(bin(t, "bcd"), "node", "--config", m.cfg, "--log-level", "debug")
	cmd.Env = append(baseEnv(), m.env()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	a := startCmd(t, cmd)
	a.waitFor(t, renewedRE, 60*time.Second)
	a.waitFor(t, renewedRE, 60*time.Second)
	if strings.Contains(a.log.String(), "open the TPM") {
		t.Errorf("bcd node under [helper] opened the TPM:\n%s", a.log)
	}
}

// startCmd runs a prepared command like startProc does.
func startCmd(t *testing.T, cmd *exec.Cmd) *agentProc {
	t.Helper()
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	a := newAgentProc(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.collect(t, pr, pw)
	return a
}
