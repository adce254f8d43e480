package load_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/load"
)

// logWriter sends the tool's warnings to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestLoadSmoke runs the load tool in a small configuration against the
// real fleetd binary and asserts its correctness checks. It never asserts
// a duration or a rate: those depend on the machine.
func TestLoadSmoke(t *testing.T) {
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "github.com/nodetrust/nodetrust/cmd/fleetd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build fleetd: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	jsonPath := filepath.Join(dir, "report.json")
	rep, err := load.Run(ctx, load.Config{
		Nodes:       300,
		Concurrency: 32,
		Renewals:    1,
		Revoke:      30,
		Fleetd:      filepath.Join(dir, "fleetd"),
		FloorTime:   20 * time.Millisecond,
		Settle:      500 * time.Millisecond,
		JSON:        jsonPath,
		Out:         &out,
		Log:         logWriter{t},
	})
	if err != nil {
		t.Fatalf("load run: %v\n%s", err, out.String())
	}
	t.Logf("report:\n%s", out.String())

	want := map[string]bool{
		"every node joined":                                   false,
		"every joined node held a live session":               false,
		"every renewal certified a new key":                   false,
		"every revoked session received its notice and ended": false,
		"no session that was not revoked ended":               false,
	}
	for _, c := range rep.Checks {
		if !c.OK {
			t.Errorf("check failed: %s: %s", c.Name, c.Detail)
		}
		if _, ok := want[c.Name]; ok {
			want[c.Name] = true
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("the report has no check %q", name)
		}
	}
	if !rep.OK {
		t.Errorf("report not OK")
	}
	ops := map[string]int{}
	for _, p := range rep.Phases {
		ops[p.Name] = p.Ops
	}
	for name, n := range map[string]int{"tokens": 300, "join": 300, "session": 300, "renew": 300, "revoke": 30} {
		if ops[name] != n {
			t.Errorf("phase %s: %d operations, want %d", name, ops[name], n)
		}
	}
	// Framed by default; gRPC only where the server refuses it (a fleetd
	// without the framed session), and the header says which.
	ri := rep.Run
	if ri.SessionTransport != "framed" || ri.SessionsFramed+ri.SessionsGRPC < 300 || ri.SessionsGRPC != ri.SessionsFellBack {
		t.Errorf("session transport %q: %d framed, %d gRPC, %d of them fallbacks; want framed asked for, 300 sessions, gRPC only as a fallback",
			ri.SessionTransport, ri.SessionsFramed, ri.SessionsGRPC, ri.SessionsFellBack)
	}
	if !strings.Contains(out.String(), "\nsessions: ") {
		t.Errorf("the report's header does not say the sessions' transport")
	}
	if rep.Floor == nil || rep.Floor.Join.ServerMicros <= 0 || rep.Floor.Renew.ServerMicros <= 0 {
		t.Errorf("no crypto floor in the report: %+v", rep.Floor)
	}

	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var back load.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("the JSON report does not parse: %v", err)
	}
	if len(back.Phases) != len(rep.Phases) || back.OK != rep.OK {
		t.Errorf("the JSON report differs from the printed one")
	}
}

// TestMainUsage checks that a command-line mistake exits 2 before
// anything starts.
func TestMainUsage(t *testing.T) {
	for _, args := range [][]string{{"--nodes", "0"}, {"--revoke", "20", "--nodes", "10"}, {"--bogus"}, {"extra"}, {"--server", "x:1"}, {"--session-transport", "quic"}} {
		var stderr bytes.Buffer
		if code := load.Main(context.Background(), args, &bytes.Buffer{}, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}
