package integration

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumPath finds Debian's chromium: under CI its absence fails the
// test, elsewhere the test is skipped.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is missing: CI needs Debian's chromium package for the console's browser tests (make deps as root)")
	}
	t.Skip("chromium is not installed (apt-get install chromium, or make deps as root)")
	return ""
}

// newBrowser starts a headless chromium with a fresh profile and returns
// a tab's context; the browser ends with the test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// Start the browser now, so that a broken chromium fails here.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	return ctx
}

// browse runs steps in the tab with a time limit.
func browse(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// read runs one action that returns a value.
func read[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// consoleProc is a running `fleetd console`.
type consoleProc struct {
	base     string // http://127.0.0.1:PORT
	loginURL string
	log      *syncBuffer
}

// startConsole runs fleetd console against cp as cred ("" for the owner)
// and returns once it printed its login address.
func startConsole(t *testing.T, cp *controlPlane, cred string) *consoleProc {
	t.Helper()
	args := []string{"console", "--config", cp.config}
	if cred != "" {
		args = append(args, "--credential", cred)
	}
	if m := httpsRE.FindStringSubmatch(cp.log.String()); m != nil {
		args = append(args, "--metrics", m[1])
	}
	cmd := exec.Command(bin(t, "fleetd"), args...)
	cmd.Env = baseEnv()
	c := &consoleProc{log: &syncBuffer{}}
	cmd.Stderr = c.log
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "open "); ok {
				urls <- u
			}
		}
		close(urls)
	}()
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("fleetd console did not stop within 10s of SIGINT")
		}
	})
	select {
	case u, ok := <-urls:
		if !ok {
			t.Fatalf("fleetd console printed no address:\n%s", c.log)
		}
		c.loginURL = u
	case <-time.After(60 * time.Second):
		t.Fatalf("fleetd console printed no address within 60s:\n%s", c.log)
	}
	i := strings.Index(c.loginURL, "/login?")
	if i < 0 {
		t.Fatalf("login address %q has no /login?", c.loginURL)
	}
	c.base = c.loginURL[:i]
	return c
}

// refusals reads the console's nodetrust_console_refusals_total of a
// reason.
func (c *consoleProc) refusals(t *testing.T, reason string) float64 {
	t.Helper()
	resp, err := http.Get(c.base + "/metrics")
	if err != nil {
		t.Fatalf("GET console /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	prefix := `nodetrust_console_refusals_total{reason="` + reason + `"} `
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("console metrics have no %s", prefix)
	return 0
}

// screenshot saves the tab as docs/console-NAME.png when
// NODETRUST_SCREENSHOTS names a folder (make screenshots).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("NODETRUST_SCREENSHOTS")
	if dir == "" {
		return
	}
	png := read(t, ctx, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(dir, "console-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
