package tpmhelper

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/tcp"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// testTPM is a real TPM for a test: swtpm or the simulator, with its
// transport, on which the test counts loaded handles (with no call in
// flight: the helper sends nothing between calls).
type testTPM struct {
	tp *tpm.TPM
	tr transport.TPM
}

// openSwtpm starts a provisioned swtpm (EK certificates from a local CA) and
// opens it over TCP on a transport the test can count handles on.
func openSwtpm(t *testing.T) testTPM {
	t.Helper()
	sw := tpmtest.StartSwtpm(t)
	tr, err := tcp.Open(tcp.Config{
		CommandAddress:  fmt.Sprintf("127.0.0.1:%d", sw.Port),
		PlatformAddress: fmt.Sprintf("127.0.0.1:%d", sw.Port+1),
	})
	if err != nil {
		t.Fatalf("open swtpm: %v", err)
	}
	tp := tpm.New(tr, tr)
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Errorf("close swtpm: %v", err)
		}
		// swtpm serves one connection: count on a new one, after ours.
		if objects, sessions := sw.Handles(t); objects != 0 || sessions != 0 {
			t.Errorf("after the test: %d transient objects and %d sessions loaded in swtpm, want 0", objects, sessions)
		}
	})
	return testTPM{tp: tp, tr: tr}
}

// requireHandles fails unless exactly objects transient objects and no
// session are loaded.
func (tt testTPM) requireHandles(t *testing.T, objects int) {
	t.Helper()
	o, s, err := tpmtest.LoadedHandles(tt.tr)
	if err != nil {
		t.Fatal(err)
	}
	if o != objects || s != 0 {
		t.Fatalf("%d transient objects and %d sessions loaded, want %d and 0", o, s, objects)
	}
}

// maxHandles fails when more than objects transient objects are loaded.
func (tt testTPM) maxHandles(t *testing.T, objects int) {
	t.Helper()
	o, s, err := tpmtest.LoadedHandles(tt.tr)
	if err != nil {
		t.Fatal(err)
	}
	if o > objects || s != 0 {
		t.Fatalf("%d transient objects and %d sessions loaded, want at most %d and 0", o, s, objects)
	}
}

// helperProc is a running helper on a real unix socket.
type helperProc struct {
	socket string
	stop   func() error
}

// startHelper serves tt on a unix socket in dir (a new temporary directory
// when empty), with the test hooks h, until the test ends or stop. The
// helper's log goes to the test's.
func startHelper(t *testing.T, tt testTPM, cfg Config, h hooks, dir string) *helperProc {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	socket := filepath.Join(dir, "helper.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, tt.tp, cfg, h) }()
	var once sync.Once
	var serveErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case serveErr = <-done:
			case <-time.After(time.Minute):
				serveErr = fmt.Errorf("Serve did not return a minute after its context was cancelled")
			}
		})
		return serveErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &helperProc{socket: socket, stop: stop}
}

// dial connects a client to p, closed when the test ends.
func dial(t *testing.T, p *helperProc, timeout time.Duration) *Client {
	t.Helper()
	c, err := DialConfig(ClientConfig{Socket: p.socket, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testWriter sends the helper's log to the test's, while it runs.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
