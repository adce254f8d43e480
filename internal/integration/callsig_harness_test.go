package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/hex"
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

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/localapi"
)

// The signed-call tests build one more program: an instance that signs
// with nothing but package localapi (testdata/callsigclient).
var (
	clientOnce sync.Once
	clientErr  error
)

func clientBin(t *testing.T) string {
	t.Helper()
	bin(t, "bcd")
	clientOnce.Do(func() {
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, "callsigclient"), "./testdata/callsigclient")
		out, err := cmd.CombinedOutput()
		if err != nil {
			clientErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if clientErr != nil {
		t.Fatalf("build callsigclient: %v", clientErr)
	}
	return filepath.Join(binDir, "callsigclient")
}

var (
	localAPIRE   = regexp.MustCompile(`msg="local API listening" .*socket=(\S+)`)
	federationRE = regexp.MustCompile(`msg="federation listening" .*addr=(\S+)`)
)

// callsigNode is a joined machine whose bcd node serves its local API and
// a federation listener on loopback.
type callsigNode struct {
	*machine
	node   string // node id
	socket string
	addr   string // federation address
	agent  *agentProc
}

// newCallsigNode joins a machine to cp as node id node and starts its bcd
// node. The socket lives in a short temporary directory: unix socket paths
// are short.
func newCallsigNode(t *testing.T, cp *controlPlane, node, extra string) *callsigNode {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "nts")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	n := &callsigNode{socket: filepath.Join(sockDir, "bcd.sock")}
	n.machine = newMachine(t, cp, "", fmt.Sprintf("%s\n[local_api]\nsocket = %q\n\n[federation]\nlisten = \"127.0.0.1:0\"\n\n[leases]\nresources = [\"gpu0\", \"gpu1\"]\n", extra, n.socket))
	if n.node = n.join(t, cp, "--node-id", node); n.node != node {
		t.Fatalf("joined as %s, want %s", n.node, node)
	}
	n.start(t)
	return n
}

// start runs bcd node and waits until it serves.
func (n *callsigNode) start(t *testing.T) {
	t.Helper()
	n.agent = startAgent(t, n.machine)
	n.agent.waitFor(t, localAPIRE, 30*time.Second)
	n.addr = n.agent.waitFor(t, federationRE, 30*time.Second)[1]
}

// stop ends bcd node with SIGTERM and waits for it.
func (n *callsigNode) stop(t *testing.T) {
	t.Helper()
	_ = n.agent.cmd.Process.Signal(os.Interrupt)
	if code := n.agent.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("bcd node exited %d:\n%s", code, n.agent.log)
	}
}

// bcd runs a bcd command against n's config.
func (n *callsigNode) bcd(t *testing.T, stdin string, cmd string, args ...string) result {
	t.Helper()
	return run(t, stdin, n.env(), "bcd", append([]string{cmd, "--config", n.cfg}, args...)...)
}

// cliKeyFile is the command line's key in n's data directory.
func (n *callsigNode) cliKeyFile() string {
	return filepath.Join(n.dataDir, "credentials", "command_line.key")
}

// client dials n's local API in process, signing as sender with key and
// a clock shifted by skew.
func (n *callsigNode) client(t *testing.T, sender string, key ed25519.PrivateKey, skew time.Duration) *localapi.Client {
	t.Helper()
	signer, err := callsig.NewSigner(callsig.SignerConfig{Sender: sender, Key: key, Now: func() time.Time { return time.Now().Add(skew) }})
	if err != nil {
		t.Fatal(err)
	}
	c, err := localapi.Dial(context.Background(), n.socket, signer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cli dials n's local API as the command line, with the key bcd node made.
func (n *callsigNode) cli(t *testing.T, skew time.Duration) *localapi.Client {
	t.Helper()
	key, err := localapi.ReadKeyFile(n.cliKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	return n.client(t, localapi.CLISender, key, skew)
}

// heldInstance is `bcd run -- callsigclient hold`: an instance that stays
// until told to exit.
type heldInstance struct {
	proc                   *agentProc
	stdin                  io.WriteCloser
	runtime, keyFile, name string
	key                    ed25519.PrivateKey
}

var (
	runtimeLineRE = regexp.MustCompile(`^runtime (\S+)`)
	keyfileLineRE = regexp.MustCompile(`^keyfile (\S+)`)
	seedLineRE    = regexp.MustCompile(`^seed ([0-9a-f]{64})`)
	callerLineRE  = regexp.MustCompile(`^caller (\S+)`)
)

// hold starts an instance named name on n and waits until it has made a
// signed call of its own (through localapi.FromEnv).
func (n *callsigNode) hold(t *testing.T, name string) *heldInstance {
	t.Helper()
	pr, pw := io.Pipe()
	h := &heldInstance{stdin: pw, name: name}
	h.proc = startProc(t, pr, n.env(), "run", "--config", n.cfg, "--name", name, "--", clientBin(t), "hold")
	t.Cleanup(func() { pw.Close() })
	h.runtime = h.proc.waitFor(t, runtimeLineRE, 30*time.Second)[1]
	h.keyFile = h.proc.waitFor(t, keyfileLineRE, 10*time.Second)[1]
	seed, err := hex.DecodeString(h.proc.waitFor(t, seedLineRE, 10*time.Second)[1])
	if err != nil {
		t.Fatal(err)
	}
	h.key = ed25519.NewKeyFromSeed(seed)
	if got := h.proc.waitFor(t, callerLineRE, 10*time.Second)[1]; got != name+"@"+n.node {
		t.Fatalf("the instance's own call proved caller %s, want %s@%s", got, name, n.node)
	}
	return h
}

// exit tells the instance to exit and waits for bcd run, which returns
// once the daemon has forgotten the key.
func (h *heldInstance) exit(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "exit\n"); err != nil {
		t.Fatal(err)
	}
	// bcd run's harness copies its standard input until it ends.
	h.stdin.Close()
	if code := h.proc.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("bcd run exited %d:\n%s", code, h.proc.log)
	}
}

// instanceCall runs `bcd run --name name -- callsigclient args…` on n to
// completion and returns the instance's one line: "ok <reply>" or
// "error <message>".
func (n *callsigNode) instanceCall(t *testing.T, name string, args ...string) string {
	t.Helper()
	r := n.bcd(t, "", "run", append([]string{"--name", name, "--", clientBin(t)}, args...)...)
	if r.code != 0 {
		t.Fatalf("bcd run %s: %s", name, r)
	}
	return strings.TrimSpace(r.stdout)
}

// wantRefusal checks that got (an "error …" line or an error's text) is a
// refusal by check that says each of parts.
func wantRefusal(t *testing.T, got, check string, parts ...string) {
	t.Helper()
	if !strings.Contains(got, "rejected: "+check+": ") {
		t.Fatalf("got %q, want a refusal by check %q", got, check)
	}
	for _, p := range parts {
		if !strings.Contains(got, p) {
			t.Errorf("refusal %q does not say %q", got, p)
		}
	}
}

// anyTLS trusts any server certificate: the tests that send hand-made
// proofs to a daemon check its refusal, not its certificate.
func anyTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} //nolint:gosec // test client
}

// ed25519Key makes a key no daemon knows.
func ed25519Key(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
