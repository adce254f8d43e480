package devswtpm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The files of swtpm's local CA that a verifier trusts: the root it made,
// and the intermediate that signed the EK certificates (fleetd.toml's
// tpm.ek_roots and tpm.ek_intermediates).
const (
	RootCertFile   = "swtpm-localca-rootca-cert.pem"
	IssuerCertFile = "issuercert.pem"
)

// Commands lists the programs Start runs, from the Debian packages swtpm and
// swtpm-tools.
var Commands = []string{"swtpm", "swtpm_setup", "swtpm_localca"}

// TPM is a running swtpm.
type TPM struct {
	// Dir holds the TPM state and the local CA (Dir/localca).
	Dir string
	// Port is the TPM command port on 127.0.0.1 (Port+1 is the control
	// port).
	Port int
	cmd  *exec.Cmd
	done chan error
}

// Spec is the tpm setting of bcd that reaches this TPM.
func (t *TPM) Spec() string { return "tcp://127.0.0.1:" + strconv.Itoa(t.Port) }

// RootCert and IssuerCert are the local CA's certificates to trust.
func (t *TPM) RootCert() string   { return filepath.Join(t.Dir, "localca", RootCertFile) }
func (t *TPM) IssuerCert() string { return filepath.Join(t.Dir, "localca", IssuerCertFile) }

// Missing returns the commands of [Commands] that are not on PATH.
func Missing() []string {
	var out []string
	for _, c := range Commands {
		if _, err := exec.LookPath(c); err != nil {
			out = append(out, c)
		}
	}
	return out
}

// Start provisions dir on its first use (an EK with certificates from a
// local CA it creates in dir/localca) and runs swtpm on a free loopback
// port pair until ctx ends or Stop is called. A dir used before keeps its
// TPM, and so its EK.
func Start(ctx context.Context, dir string) (*TPM, error) {
	if m := Missing(); len(m) > 0 {
		return nil, fmt.Errorf("--swtpm needs %s: install the Debian packages swtpm and swtpm-tools (apt-get install swtpm swtpm-tools)", strings.Join(m, ", "))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("swtpm state folder: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tpm2-00.permall")); errors.Is(err, os.ErrNotExist) {
		if err := provision(ctx, dir); err != nil {
			return nil, err
		}
	}
	var lastErr error
	for range 5 {
		port, err := adjacentPorts()
		if err != nil {
			return nil, err
		}
		t, err := run(ctx, dir, port)
		if err == nil {
			return t, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// provision runs swtpm_setup with a local CA kept inside dir (Debian's
// default configuration writes under /var/lib).
func provision(ctx context.Context, dir string) error {
	ca := filepath.Join(dir, "localca")
	if err := os.MkdirAll(ca, 0o700); err != nil {
		return err
	}
	files := map[string]string{
		filepath.Join(ca, "swtpm-localca.conf"): fmt.Sprintf("statedir = %s\nsigningkey = %s\nissuercert = %s\ncertserial = %s\n",
			ca, filepath.Join(ca, "signkey.pem"), filepath.Join(ca, IssuerCertFile), filepath.Join(ca, "certserial")),
		filepath.Join(ca, "swtpm-localca.options"): "--platform-manufacturer nodetrust\n--platform-version 1.0\n--platform-model swtpm\n",
		filepath.Join(dir, "swtpm_setup.conf"): fmt.Sprintf("create_certs_tool = %s\ncreate_certs_tool_config = %s\ncreate_certs_tool_options = %s\nactive_pcr_banks = sha256\n",
			lookPath("swtpm_localca"), filepath.Join(ca, "swtpm-localca.conf"), filepath.Join(ca, "swtpm-localca.options")),
	}
	for p, text := range files {
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			return err
		}
	}
	log := filepath.Join(dir, "swtpm_setup.log")
	cmd := exec.CommandContext(ctx, "swtpm_setup", "--tpm2", "--tpmstate", dir, "--config", filepath.Join(dir, "swtpm_setup.conf"),
		"--createek", "--create-ek-cert", "--create-platform-cert", "--ecc", "--pcr-banks", "sha256", "--overwrite", "--logfile", log)
	if out, err := cmd.CombinedOutput(); err != nil {
		b, _ := os.ReadFile(log)
		return fmt.Errorf("swtpm_setup: %w\n%s%s", err, out, b)
	}
	return nil
}

func lookPath(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return name
}

// run starts swtpm on port and port+1 and waits until it accepts.
func run(ctx context.Context, dir string, port int) (*TPM, error) {
	cmd := exec.Command("swtpm", "socket", "--tpm2",
		"--server", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", port),
		"--ctrl", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", port+1),
		"--tpmstate", "dir="+dir,
		"--flags", "not-need-init,startup-clear",
		"--log", "file="+filepath.Join(dir, "swtpm.log"))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start swtpm: %w", err)
	}
	t := &TPM{Dir: dir, Port: port, cmd: cmd, done: make(chan error, 1)}
	go func() { t.done <- cmd.Wait() }()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-t.done:
			b, _ := os.ReadFile(filepath.Join(dir, "swtpm.log"))
			return nil, fmt.Errorf("swtpm exited before it served %s: %v\n%s", addr, err, b)
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		default:
		}
		// Polling with a deadline: swtpm is an external process that
		// signals nothing when it listens.
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return t, nil
		}
		if time.Now().After(deadline) {
			t.Stop()
			return nil, fmt.Errorf("swtpm did not serve %s within 10s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends swtpm and waits for it.
func (t *TPM) Stop() {
	if t.cmd.Process == nil {
		return
	}
	_ = t.cmd.Process.Signal(os.Interrupt)
	select {
	case <-t.done:
	case <-time.After(5 * time.Second):
		_ = t.cmd.Process.Kill()
		<-t.done
	}
}

// adjacentPorts finds a port P on 127.0.0.1 with P and P+1 free.
func adjacentPorts() (int, error) {
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := ln.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1)))
		ln.Close()
		if err != nil || p >= 65535 {
			continue
		}
		next.Close()
		return p, nil
	}
	return 0, errors.New("no two adjacent free ports on 127.0.0.1 for swtpm")
}
