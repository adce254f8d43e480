package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	binDir   string
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodetrust-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	// Tests that run bcd as another user (bcd node under [helper]) need to
	// reach the binaries.
	_ = os.Chmod(binDir, 0o755)
	args := []string{"build", "-o", binDir + "/"}
	if os.Getenv("NODETRUST_TEST_RACE") != "" {
		// Binaries with the race detector: a data race makes them exit 66.
		args = append(args, "-race")
	}
	args = append(args, "github.com/nodetrust/nodetrust/cmd/fleetd", "github.com/nodetrust/nodetrust/cmd/bcd")
	cmd := exec.Command("go", args...)
	cmd.Stderr = os.Stderr
	buildErr = cmd.Run()
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func bin(t testing.TB, name string) string {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("build the binaries: %v", buildErr)
	}
	return filepath.Join(binDir, name)
}

// result is a finished command.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// run runs a binary to completion with stdin and extra environment.
func run(t *testing.T, stdin string, env []string, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t, name), args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(baseEnv(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %s %v: %v", name, args, err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// baseEnv is the environment without any join token, so a test's token
// can only come from where the test puts it.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "BCD_JOIN_TOKEN=") || strings.HasPrefix(kv, "FLEETD_CONFIG=") || strings.HasPrefix(kv, "NODETRUST_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// syncBuffer collects a process's output while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// controlPlane is a running `fleetd serve` with its own PKI.
type controlPlane struct {
	dir    string
	config string
	addr   string
	bundle struct {
		TrustDomain          string `json:"trust_domain"`
		ServingCASPKIPin     string `json:"serving_ca_spki_pin"`
		JoinSigningKeyPin    string `json:"join_signing_key_pin"`
		JoinEncryptionKeyPin string `json:"join_encryption_key_pin"`
	}
	log    *syncBuffer
	cmd    *exec.Cmd
	exited chan struct{}
	// env is added to the environment of fleetd serve.
	env     []string
	waitErr error
}

var servingRE = regexp.MustCompile(`msg="fleetd serving" grpc=(\S+)`)

// startControlPlane runs fleetd init and fleetd serve on a free loopback
// port, and returns once the server says it is serving.
func startControlPlane(t *testing.T, extraConfig string) *controlPlane {
	t.Helper()
	return startControlPlaneWith(t, cpOptions{extraConfig: extraConfig})
}

// cpOptions vary the control plane startControlPlaneWith starts.
type cpOptions struct {
	// extraConfig is appended to fleetd.toml.
	extraConfig string
	// initArgs are added to fleetd init's arguments, with --config
	// naming the fleetd.toml (so that init reads its [pkcs11] section).
	initArgs []string
	// env is added to the environment of fleetd init and serve.
	env []string
}

// startControlPlaneWith is startControlPlane with options.
func startControlPlaneWith(t *testing.T, o cpOptions) *controlPlane {
	t.Helper()
	extraConfig := o.extraConfig
	dir := t.TempDir()
	cp := &controlPlane{dir: dir, config: filepath.Join(dir, "fleetd.toml"), log: &syncBuffer{}, env: o.env}
	if len(o.initArgs) > 0 {
		// init reads the [pkcs11] section of the config.
		cp.writeConfig(t, "127.0.0.1:0", extraConfig)
	}
	initArgs := []string{"init", "--dir", filepath.Join(dir, "pki"), "--trust-domain", "test.nodetrust.example", "--server-name", "fleetd.test"}
	if len(o.initArgs) > 0 {
		initArgs = append(append(initArgs, "--config", cp.config), o.initArgs...)
	}
	if r := run(t, "", o.env, "fleetd", initArgs...); r.code != 0 {
		t.Fatalf("fleetd init: %s", r)
	}
	b, err := os.ReadFile(filepath.Join(dir, "pki", "pki-bundle.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &cp.bundle); err != nil {
		t.Fatal(err)
	}
	cp.writeConfig(t, "127.0.0.1:0", extraConfig)
	cp.serve(t)
	// Admin commands read the address from the config.
	cp.writeConfig(t, cp.addr, extraConfig)
	return cp
}

// serve runs fleetd serve on cp.config and returns once it says it is
// serving, with cp.addr set; the server is stopped when the test ends.
func (cp *controlPlane) serve(t *testing.T) {
	t.Helper()
	cp.log = &syncBuffer{}

	cmd := exec.Command(bin(t, "fleetd"), "serve", "--config", cp.config)
	cmd.Env = append(baseEnv(), cp.env...)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	cmd.Stdout = cp.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cp.cmd = cmd
	t.Cleanup(func() { cp.stop(t) })
	ready := make(chan string, 1)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			cp.log.Write([]byte(line + "\n"))
			if m := servingRE.FindStringSubmatch(line); m != nil && !sent {
				ready <- m[1]
				sent = true
			}
		}
		close(ready)
	}()
	cp.exited = make(chan struct{})
	// exited closes once fleetd has exited and its last line is in cp.log.
	go func() { cp.waitErr = cmd.Wait(); pw.Close(); <-collected; close(cp.exited) }()
	select {
	case addr, ok := <-ready:
		if !ok {
			t.Fatalf("fleetd serve exited before serving:\n%s", cp.log)
		}
		cp.addr = addr
	case <-time.After(60 * time.Second):
		t.Fatalf("fleetd serve did not start within 60s:\n%s", cp.log)
	}
}

func (cp *controlPlane) writeConfig(t *testing.T, listen, extra string) {
	t.Helper()
	text := fmt.Sprintf("pki_dir = \"pki\"\ndata_dir = \"data\"\nlisten = %q\nlog_level = \"debug\"\n%s", listen, extra)
	if err := os.WriteFile(cp.config, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// stop ends the server with SIGTERM and checks that it exits cleanly.
func (cp *controlPlane) stop(t *testing.T) {
	t.Helper()
	if cp.cmd == nil || cp.cmd.Process == nil {
		return
	}
	_ = cp.cmd.Process.Signal(os.Interrupt)
	select {
	case <-cp.exited:
		if cp.waitErr != nil {
			t.Errorf("fleetd did not stop cleanly: %v\n%s", cp.waitErr, cp.log)
		}
	case <-time.After(15 * time.Second):
		_ = cp.cmd.Process.Kill()
		t.Errorf("fleetd did not stop within 15s of SIGINT")
	}
	cp.cmd = nil
}

// token creates a join token with fleetd token create and returns it.
func (cp *controlPlane) token(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, "", nil, "fleetd", append([]string{"token", "create", "--config", cp.config}, args...)...)
	if r.code != 0 {
		t.Fatalf("fleetd token create: %s", r)
	}
	tok := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(tok, "ntjt_") {
		t.Fatalf("token create printed %q, want a token", tok)
	}
	return tok
}

// joinArgs are the bootstrap flags for bcd join against cp.
func (cp *controlPlane) joinArgs(dataDir string) []string {
	return []string{"join",
		"--server", cp.addr, "--server-name", "fleetd.test",
		"--serving-ca-spki-pin", cp.bundle.ServingCASPKIPin,
		"--join-signing-key-pin", cp.bundle.JoinSigningKeyPin,
		"--join-encryption-key-pin", cp.bundle.JoinEncryptionKeyPin,
		"--data-dir", dataDir,
	}
}

// claimsEnv gives each simulated machine its own (empty) hardware tree, so
// several nodes can join from one host.
func claimsEnv(t *testing.T) []string {
	return []string{"NODETRUST_DEBUG_CLAIMS_ROOT=" + t.TempDir()}
}
