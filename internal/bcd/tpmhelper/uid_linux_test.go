package tpmhelper

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// childEnv makes the test binary a client of the helper at the socket it
// names (see childMain), for tests that run it as another uid.
const childEnv = "NODETRUST_TPMHELPER_TEST_CHILD"

// The exit codes of childMain.
const (
	childSigned = 0
	childFailed = 2
	childDenied = 3
)

func TestMain(m *testing.M) {
	if socket := os.Getenv(childEnv); socket != "" {
		os.Exit(childMain(socket))
	}
	os.Exit(m.Run())
}

// childMain dials the helper at socket, makes a node key, signs with it and
// releases it. It prints what happened.
func childMain(socket string) int {
	c, err := Dial(socket)
	if err != nil {
		fmt.Printf("uid %d: %v\n", os.Getuid(), err)
		if errors.Is(err, ErrDenied) {
			return childDenied
		}
		return childFailed
	}
	defer c.Close()
	key, _, err := c.NewNodeKey(context.Background())
	if err != nil {
		fmt.Printf("uid %d: %v\n", os.Getuid(), err)
		return childFailed
	}
	digest := sha256.Sum256([]byte("child"))
	_, err = key.Sign(rand.Reader, digest[:], crypto.SHA256)
	if cerr := key.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Printf("uid %d: %v\n", os.Getuid(), err)
		return childFailed
	}
	fmt.Printf("uid %d: signed\n", os.Getuid())
	return childSigned
}

// nobody is the uid and gid the child runs as.
const nobody = 65534

// testRefusesOtherUID runs a client as uid 65534 in a child process (this
// test binary, copied where that uid can run it): a helper whose [helper]
// user is another uid refuses it, and one whose [helper] user it is serves
// it. The test process itself is root, which every helper serves.
func testRefusesOtherUID(t *testing.T, tt testTPM) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs as root; running a client as another uid needs root")
		}
		t.Skip("running a client as another uid needs root")
	}
	dir := t.TempDir()
	// The socket's directory, and the one above it, must be reachable by
	// the child's uid.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "tpmhelper.test")
	copyExecutable(t, bin)

	run := func(t *testing.T, socket string) (int, string) {
		t.Helper()
		if err := os.Chmod(socket, 0o666); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin)
		cmd.Dir = "/"
		cmd.Env = []string{childEnv + "=" + socket}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("run the child: %v\n%s", err, out)
		}
		return cmd.ProcessState.ExitCode(), string(out)
	}

	t.Run("another uid is refused", func(t *testing.T) {
		p := startHelper(t, tt, Config{AllowedUID: 4242}, hooks{}, dir)
		code, out := run(t, p.socket)
		t.Logf("child: %s", out)
		if code != childDenied || !strings.Contains(out, "uid 65534 may not use the TPM helper") || !strings.Contains(out, "uid 4242") {
			t.Fatalf("the child exited %d: %s; want a refusal (exit %d) naming its uid and the [helper] user's", code, out, childDenied)
		}
		// Root is served by the same helper.
		c := dial(t, p, 0)
		if _, err := c.EKCertificates(context.Background()); err != nil {
			t.Fatalf("root: %v", err)
		}
		if err := p.stop(); err != nil {
			t.Fatal(err)
		}
		tt.requireHandles(t, 0)
	})
	t.Run("the [helper] user is served", func(t *testing.T) {
		p := startHelper(t, tt, Config{AllowedUID: nobody}, hooks{}, dir)
		code, out := run(t, p.socket)
		t.Logf("child: %s", out)
		if code != childSigned {
			t.Fatalf("the child exited %d: %s; want it served", code, out)
		}
		tt.requireHandles(t, 0) // it released its key
	})
}

// copyExecutable copies this test binary to dst, executable by everyone.
func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSwtpmRefusesOtherUID(t *testing.T) {
	t.Parallel()
	testRefusesOtherUID(t, openSwtpm(t))
}
