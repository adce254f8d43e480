package integration

import (
	"bufio"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// startDev runs fleetd dev --dir dir (with extra args) and returns once it
// printed the join command (its dev.env is written by then).
func startDev(t *testing.T, dir string, log *syncBuffer, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin(t, "fleetd"), append([]string{"dev", "--dir", dir}, extra...)...)
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

// printedJoin returns the arguments of the bcd join command fleetd dev
// printed, as a user would copy it.
func printedJoin(t *testing.T, out string) []string {
	t.Helper()
	var words []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "bcd join") {
			in = true
		}
		if !in {
			continue
		}
		words = append(words, strings.Fields(strings.TrimSuffix(trimmed, "\\"))...)
		if !strings.HasSuffix(trimmed, "\\") {
			break
		}
	}
	if len(words) < 2 || words[0] != "bcd" {
		t.Fatalf("fleetd dev printed no bcd join command:\n%s", out)
	}
	return words[1:]
}

func TestDevServerTPMJoinWithItsOwnSoftwareTPM(t *testing.T) {
	tpmtest.RequireSwtpm(t)
	dir := t.TempDir()
	log := &syncBuffer{}
	cmd := startDev(t, dir, log, "--swtpm")
	env := readEnvFile(t, filepath.Join(dir, "dev.env"))
	args := printedJoin(t, log.String())
	if !slices.Contains(args, "--attestor") || env["BCD_TPM"] == "" || !slices.Contains(args, env["BCD_TPM"]) {
		t.Fatalf("the printed command is no TPM join on the dev TPM: %q\n%s", args, log)
	}
	cfg, err := os.ReadFile(env["FLEETD_CONFIG"])
	if err != nil || !strings.Contains(string(cfg), "swtpm-localca-rootca-cert.pem") || !strings.Contains(string(cfg), "issuercert.pem") {
		t.Fatalf("fleetd.toml does not trust the dev TPM's CA: %s, %v", cfg, err)
	}

	// The printed command, as printed.
	r := run(t, "", claimsEnv(t), "bcd", args...)
	mm := joinedRE.FindStringSubmatch(r.stdout)
	if r.code != 0 || mm == nil {
		t.Fatalf("the printed TPM join: %s\n%s", r, log)
	}
	node := mm[1]
	show := run(t, "", nil, "fleetd", "nodes", "show", node, "--config", env["FLEETD_CONFIG"], "--json")
	if jsonField(show.stdout, "attestor") != "tpm" {
		t.Errorf("the node of the dev TPM join: %s", show.stdout)
	}
	// As the output says: the same command without the token, after
	// --reset --yes, brings the node back by its EK.
	var again []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--token-file" {
			i++
			continue
		}
		again = append(again, args[i])
	}
	r = run(t, "", claimsEnv(t), "bcd", append(again, "--reset", "--yes")...)
	mm = joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
	if r.code != 0 || mm == nil || mm[1] != node {
		t.Fatalf("the TPM join again without a token: %s", r)
	}
	stopDev(t, cmd, log)
	// The software TPM stopped with fleetd dev.
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(env["BCD_TPM"], "tcp://"), time.Second); err == nil {
		c.Close()
		t.Errorf("the dev TPM still serves %s after fleetd dev stopped", env["BCD_TPM"])
	}
}

func TestDevServerTrustsTheEKRootsItIsGiven(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	certs := t.TempDir()
	root, inter := filepath.Join(certs, "root.pem"), filepath.Join(certs, "issuer.pem")
	for p, c := range map[string][]byte{root: sw.RootCertificate(t).Raw, inter: sw.IssuerCertificate(t).Raw} {
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c}), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("a file that holds no certificate is refused", func(t *testing.T) {
		bad := filepath.Join(certs, "bad.pem")
		if err := os.WriteFile(bad, []byte("not a certificate\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := run(t, "", nil, "fleetd", "dev", "--dir", t.TempDir(), "--ek-roots", bad)
		if r.code != 2 || !strings.Contains(r.stderr, "--ek-roots "+bad) {
			t.Errorf("fleetd dev --ek-roots with no certificate: %s", r)
		}
	})
	dir := t.TempDir()
	log := &syncBuffer{}
	cmd := startDev(t, dir, log, "--ek-roots", root, "--ek-intermediates", inter)
	args := append(printedJoin(t, log.String()), "--attestor", "tpm", "--tpm", sw.Spec())
	r := run(t, "", claimsEnv(t), "bcd", args...)
	if r.code != 0 || !joinedRE.MatchString(r.stdout) {
		t.Fatalf("a TPM join against fleetd dev --ek-roots: %s\n%s", r, log)
	}
	stopDev(t, cmd, log)
}
