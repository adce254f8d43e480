package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"
)

// machine is one simulated machine: its config.toml, data directory and
// hardware tree.
type machine struct {
	cfg, dataDir, claims string
}

// newMachine writes a config.toml for cp (with join-encryption.jwk beside
// it) and a hardware tree with productUUID, when given.
func newMachine(t *testing.T, cp *controlPlane, productUUID, extra string) *machine {
	t.Helper()
	root := t.TempDir()
	m := &machine{cfg: filepath.Join(root, "etc", "config.toml"), dataDir: filepath.Join(root, "var", "bcd"), claims: filepath.Join(root, "hw")}
	if err := os.MkdirAll(filepath.Join(m.claims, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.claims, "etc", "hostname"), []byte("machine-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if productUUID != "" {
		dmi := filepath.Join(m.claims, "sys", "class", "dmi", "id")
		if err := os.MkdirAll(dmi, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dmi, "product_uuid"), []byte(productUUID+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(m.cfg), 0o755); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf("server = %q\nserver_name = \"fleetd.test\"\ndata_dir = %q\nserving_ca_spki_pin = %q\njoin_signing_key_pin = %q\njoin_encryption_key_pin = %q\n%s",
		cp.addr, m.dataDir, cp.bundle.ServingCASPKIPin, cp.bundle.JoinSigningKeyPin, cp.bundle.JoinEncryptionKeyPin, extra)
	if err := os.WriteFile(m.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	jwk, err := os.ReadFile(filepath.Join(cp.dir, "pki", "join-encryption.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(m.cfg), "join-encryption.jwk"), jwk, 0o644); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *machine) env(extra ...string) []string {
	return append([]string{"NODETRUST_DEBUG_CLAIMS_ROOT=" + m.claims}, extra...)
}

// join joins m with a fresh token made with tokenArgs and returns the node id.
func (m *machine) join(t *testing.T, cp *controlPlane, tokenArgs ...string) string {
	t.Helper()
	tok := cp.token(t, append([]string{"--role", "worker"}, tokenArgs...)...)
	r := run(t, tok, m.env(), "bcd", "join", "--config", m.cfg)
	mm := joinedRE.FindStringSubmatch(r.stdout)
	if r.code != 0 || mm == nil {
		t.Fatalf("bcd join: %s", r)
	}
	return mm[1]
}

// agentProc is a running `bcd node`.
type agentProc struct {
	cmd    *exec.Cmd
	log    *syncBuffer
	lines  chan string
	exited chan struct{}
	err    error
}

// startAgent runs bcd node for m with extra environment.
func startAgent(t *testing.T, m *machine, env ...string) *agentProc {
	t.Helper()
	return startProc(t, nil, m.env(env...), "node", "--config", m.cfg, "--log-level", "debug")
}

// startProc runs bcd with args in the background, collecting its output.
func startProc(t *testing.T, stdin io.Reader, env []string, args ...string) *agentProc {
	t.Helper()
	cmd := exec.Command(bin(t, "bcd"), args...)
	cmd.Env = append(baseEnv(), env...)
	cmd.Stdin = stdin
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	cmd.Stdout = pw
	a := newAgentProc(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.collect(t, pr, pw)
	return a
}

func newAgentProc(cmd *exec.Cmd) *agentProc {
	return &agentProc{cmd: cmd, log: &syncBuffer{}, lines: make(chan string, 1024), exited: make(chan struct{})}
}

// collect reads the started process's output and stops it when the test
// ends.
func (a *agentProc) collect(t *testing.T, pr *io.PipeReader, pw *io.PipeWriter) {
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			a.log.Write([]byte(sc.Text() + "\n"))
			select {
			case a.lines <- sc.Text():
			default:
			}
		}
		close(a.lines)
	}()
	// exited closes once the process has exited and its last line is in
	// a.log: a test that reads the log after wait sees all of it.
	go func() { a.err = a.cmd.Wait(); pw.Close(); <-collected; close(a.exited) }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.exited:
		case <-time.After(10 * time.Second):
			_ = a.cmd.Process.Kill()
		}
	})
}

func regexpMust(s string) *regexp.Regexp { return regexp.MustCompile(s) }

// waitFor reads the agent's output until a line matches re, and returns
// the submatches; it fails the test if the agent exits first or after
// limit.
func (a *agentProc) waitFor(t *testing.T, re *regexp.Regexp, limit time.Duration) []string {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case line, ok := <-a.lines:
			if !ok {
				t.Fatalf("bcd node ended before %q:\n%s", re, a.log)
			}
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-deadline:
			t.Fatalf("no %q from bcd node within %s:\n%s", re, limit, a.log)
		}
	}
}

// wait waits for the agent to exit and returns its exit code (-1 for a
// signal).
func (a *agentProc) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-a.exited:
	case <-time.After(limit):
		t.Fatalf("bcd node did not exit within %s:\n%s", limit, a.log)
	}
	if a.cmd.ProcessState == nil {
		t.Fatalf("no process state")
	}
	return a.cmd.ProcessState.ExitCode()
}

var (
	sessionOpenRE = regexp.MustCompile(`msg="session open"`)
	renewedRE     = regexp.MustCompile(`msg=renewed .*serial=(\S+) key=(\S+)`)
)
