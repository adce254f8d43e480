package integration

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// Boot policy end to end with the real binaries and swtpm (issue 10): swtpm
// measures no boot, so a node that sends no event log replays (every
// quoted PCR holds its initial value) and passes a policy without Secure
// Boot; a log written to the node's [boot_check] event_log afterwards does
// not replay to the quoted PCRs — TPM-proven evidence that the boot is
// not what the node says, which fails rule event_log.

// bootPolicyConfig writes a policy per default class accepting a boot
// without Secure Boot, and returns the fleetd.toml lines that load them
// (with a short boot check timeout) and post cordons to webhook.
func bootPolicyConfig(t *testing.T, webhook string) string {
	t.Helper()
	dir := t.TempDir()
	for _, class := range []string{"worker", "control-plane", "install-environment"} {
		if err := os.WriteFile(filepath.Join(dir, class+".toml"), []byte(fmt.Sprintf("class = %q\nsecure_boot = false\n", class)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("[boot_policy]\ndir = %q\nboot_check_timeout = \"2s\"\n[actuator]\nwebhook_url = %q\n", dir, webhook)
}

// fakeCordonReceiver stands in for the operator's automation behind the
// webhook actuator: it records each cordon request's node id.
func fakeCordonReceiver(t *testing.T) (string, chan string) {
	t.Helper()
	got := make(chan string, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c struct {
			Action string `json:"action"`
			NodeID string `json:"node_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil || c.Action != "cordon" {
			http.Error(w, "want a cordon", http.StatusBadRequest)
			return
		}
		got <- c.NodeID
	}))
	t.Cleanup(srv.Close)
	return srv.URL, got
}

// writeFalseLog writes a measurement log swtpm's PCRs do not replay to.
func writeFalseLog(t *testing.T, path string) {
	t.Helper()
	var l tpmtest.EventLog
	l.SecureBootVariables(false, nil, nil, nil, nil)
	l.Separators(0, 1, 2, 3, 4, 5, 6, 7)
	if err := os.WriteFile(path, l.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (cp *controlPlane) nodeState(t *testing.T, id string) string {
	t.Helper()
	return jsonField(cp.mustFleetd(t, "", "nodes", "show", id, "--json").stdout, "state")
}

func (cp *controlPlane) verdictCount(t *testing.T, id string) int {
	t.Helper()
	var vs []json.RawMessage
	if err := json.Unmarshal([]byte(cp.mustFleetd(t, "", "nodes", "verdicts", id, "--json").stdout), &vs); err != nil {
		t.Fatal(err)
	}
	return len(vs)
}

func TestBootCheckQuarantinesAWorkerUntilItsRelease(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	webhook, cordons := fakeCordonReceiver(t)
	cp := startControlPlane(t, "node_cert_lifetime = \"2m\"\nrenewal_limit = 1000\n"+ekRootsConfig(t, sw)+bootPolicyConfig(t, webhook))
	eventLog := filepath.Join(t.TempDir(), "binary_bios_measurements")
	m := tpmMachine(t, cp, uuid1, sw, "[renewal]\nbackoff_min = \"1s\"\nbackoff_max = \"2s\"\n[boot_check]\nevent_log = \""+eventLog+"\"\n")
	node := joinedAs(t, tpmJoin(t, m, cp.token(t, "--role", "worker"), false))
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)

	if r := cp.fleetd(t, "", "nodes", "check", node); r.code != 0 || !strings.Contains(r.stdout, "boot pass (class worker, boot-check); action: none") {
		t.Fatalf("check of a boot the policy accepts: %s", r)
	}
	if n := cp.verdictCount(t, node); n != 1 {
		t.Fatalf("%d verdicts after one boot check", n)
	}

	t.Run("an unanswered nonce changes nothing", func(t *testing.T) {
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		r := cp.fleetd(t, "", "nodes", "check", node)
		if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if r.code == 0 || !strings.Contains(r.stderr, "nothing changed") {
			t.Errorf("check of a node that does not answer: %s", r)
		}
		if s := cp.nodeState(t, node); s != "active" {
			t.Errorf("state %s", s)
		}
		if n := cp.verdictCount(t, node); n != 1 {
			t.Errorf("%d verdicts, want the one before", n)
		}
	})

	t.Run("a request without TPM proof cannot quarantine anything", func(t *testing.T) {
		// A token node (no TPM, no AK) speaks on its own session: it
		// gets no nonce, and evidence it makes up is not evaluated.
		tm := newMachine(t, cp, uuid2, "")
		other := tm.join(t, cp)
		st, err := identity.LoadState(tm.dataDir, identity.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cert := tlsCert(st)
		conn, _, _, err := agent.Dial([]string{cp.addr}, "fleetd.test", parsePins(t, cp).ServingCA, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil })
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stream, err := gatewayv1.NewGatewayClient(conn).Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exchange := func(req *gatewayv1.SessionRequest) *gatewayv1.SessionResponse {
			t.Helper()
			if err := stream.Send(req); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		if w := exchange(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "forger"}}}); w.GetWelcome() == nil {
			t.Fatalf("no welcome: %v", w)
		}
		r := exchange(&gatewayv1.SessionRequest{Id: 2, Body: &gatewayv1.SessionRequest_NonceRequest{NonceRequest: &gatewayv1.NonceRequest{Purpose: gatewayv1.NoncePurpose_NONCE_PURPOSE_BOOT_CHECK}}})
		if e := r.GetError(); e == nil || codes.Code(e.Code) != codes.FailedPrecondition || !strings.Contains(e.Message, "names no TPM AK") {
			t.Errorf("a nonce for a node without an AK: %v", r)
		}
		zeros := map[uint32][]byte{}
		for i := range uint32(8) {
			zeros[i] = make([]byte, 32)
		}
		r = exchange(&gatewayv1.SessionRequest{Id: 3, Body: &gatewayv1.SessionRequest_BootEvidence{BootEvidence: &gatewayv1.BootEvidence{
			Nonce: make([]byte, 32), Pcrs: zeros, EventLog: []byte("not a log"), QuoteAttest: []byte("forged"), QuoteSignature: []byte("forged")}}})
		if r.GetBootResult().GetResult() != "not-evaluated" {
			t.Errorf("forged evidence: %v", r)
		}
		for _, id := range []string{node, other} {
			if s := cp.nodeState(t, id); s != "active" {
				t.Errorf("node %s is %s", id, s)
			}
		}
		if n := cp.verdictCount(t, other); n != 0 {
			t.Errorf("%d verdicts of the token node", n)
		}
	})

	t.Run("a dropped session changes nothing", func(t *testing.T) {
		_ = a.cmd.Process.Signal(os.Interrupt)
		if code := a.wait(t, 30*time.Second); code != 0 {
			t.Errorf("bcd node exited %d", code)
		}
		r := cp.fleetd(t, "", "nodes", "check", node)
		if r.code == 0 || !strings.Contains(r.stderr, "no live session") {
			t.Errorf("check of a node without a session: %s", r)
		}
		if s := cp.nodeState(t, node); s != "active" {
			t.Errorf("state %s", s)
		}
	})

	b := startAgent(t, m)
	b.waitFor(t, sessionOpenRE, 30*time.Second)
	writeFalseLog(t, eventLog)
	r := cp.fleetd(t, "", "nodes", "check", node)
	// A renewal in between may have carried the failing quote first.
	if r.code != 1 || !strings.Contains(r.stdout, "FAIL event_log") || !strings.Contains(r.stdout, "quarantined") {
		t.Fatalf("check of a boot whose log does not replay: %s", r)
	}
	if s := cp.nodeState(t, node); s != "quarantined" {
		t.Fatalf("state %s after a failed boot check, want quarantined", s)
	}
	select {
	case id := <-cordons:
		if id != node {
			t.Errorf("cordon of %s, want %s", id, node)
		}
	case <-time.After(30 * time.Second):
		t.Error("no cordon reached the webhook receiver")
	}
	if v := cp.mustFleetd(t, "", "nodes", "verdicts", node).stdout; !strings.Contains(v, "fail") || !strings.Contains(v, "event_log: the log does not replay") {
		t.Errorf("fleetd nodes verdicts:\n%s", v)
	}
	if h := cp.history(t, node); !strings.Contains(h, "bootpolicy") || !strings.Contains(h, "event_log") {
		t.Errorf("history:\n%s", h)
	}
	b.waitFor(t, regexpMust(`msg="renewal failed".*quarantined: renewal refused until fleetd nodes release `+node), 120*time.Second)

	operator := cp.credential(t, "olga", "operator")
	if r := cp.fleetd(t, operator, "nodes", "release", node, "--reason", "log restored"); r.code == 0 || !strings.Contains(r.stderr, "PermissionDenied") {
		t.Errorf("an operator's release: %s", r)
	}
	if err := os.Remove(eventLog); err != nil {
		t.Fatal(err)
	}
	cp.mustFleetd(t, "", "nodes", "release", node, "--reason", "log restored")
	b.waitFor(t, renewedRE, 60*time.Second)
	if s := cp.nodeState(t, node); s != "active" {
		t.Errorf("state %s after the release and a renewal", s)
	}
	if v := cp.mustFleetd(t, "", "nodes", "verdicts", node, "--limit", "1").stdout; !strings.Contains(v, "renewal") || !strings.Contains(v, "pass") {
		t.Errorf("the latest verdict after the release:\n%s", v)
	}
}

func TestBootCheckOfAControlPlaneMachineOnlyAlerts(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	webhook, cordons := fakeCordonReceiver(t)
	cp := startControlPlane(t, "node_cert_lifetime = \"20s\"\nrenewal_limit = 1000\n"+bootPolicyConfig(t, webhook))
	declarer := cp.credential(t, "alice", "declarer")
	cp.apply(t, declarer, inventoryFile(decl{"cp-01", uuid1, "control-plane", ekPin(t, sw)}))
	cp.mustFleetd(t, "", "nodes", "provision", "cp-01", "--reason", "first install")
	eventLog := filepath.Join(t.TempDir(), "binary_bios_measurements")
	m := tpmMachine(t, cp, uuid1, sw, "[renewal]\nbackoff_min = \"1s\"\nbackoff_max = \"2s\"\n[boot_check]\nevent_log = \""+eventLog+"\"\n")
	if node := joinedAs(t, tpmJoin(t, m, "", false)); node != "cp-01" {
		t.Fatalf("joined as %s", node)
	}
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)
	writeFalseLog(t, eventLog)
	before := len(cp.log.String())
	r := cp.fleetd(t, "", "nodes", "check", "cp-01")
	if r.code != 1 || !strings.Contains(r.stdout, "boot fail (class control-plane, boot-check); action: alerted") {
		t.Fatalf("check of a control-plane machine whose log does not replay: %s", r)
	}
	if s := cp.nodeState(t, "cp-01"); s != "active" {
		t.Errorf("state %s, want active: a control plane is only alerted", s)
	}
	if logged := cp.log.String()[before:]; !strings.Contains(logged, "ALERT: a control-plane machine failed its boot policy") {
		t.Errorf("no alert in the server log:\n%s", tail(logged, 20))
	}
	// It keeps renewing: its renewals' failed verdicts alert too.
	a.waitFor(t, renewedRE, 60*time.Second)
	if s := cp.nodeState(t, "cp-01"); s != "active" {
		t.Errorf("state %s after a renewal", s)
	}
	if len(cordons) != 0 {
		t.Errorf("a cordon was requested for a control-plane machine")
	}
}
