package integration

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startDev runs fleetd dev --dir dir and returns once it printed the join
// command (its dev.env is written by then).
func startDev(t *testing.T, dir string, log *syncBuffer) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin(t, "fleetd"), "dev", "--dir", dir)
	cmd.Env = baseEnv()
	cmd.Stderr = log
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			log.Write([]byte(sc.Text() + "\n"))
			if strings.HasPrefix(sc.Text(), "Stop with Ctrl-C") && !sent {
				ready <- true
				sent = true
			}
		}
		close(ready)
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("fleetd dev exited early:\n%s", log)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("fleetd dev did not get ready:\n%s", log)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd
}

func stopDev(t *testing.T, cmd *exec.Cmd, log *syncBuffer) {
	t.Helper()
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Errorf("fleetd dev did not stop cleanly: %v\n%s", err, log)
	}
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		env[k] = v
	}
	for _, k := range []string{"FLEETD_SERVER", "FLEETD_CONFIG", "BCD_DATA_DIR", "BCD_TOKEN_FILE"} {
		if env[k] == "" {
			t.Fatalf("%s has no %s", filepath.Base(path), k)
		}
	}
	return env
}
