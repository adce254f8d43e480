package load

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/debugserver"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// controlPlane is the fleetd a run drives: one it started, or a running
// one named by its fleetd.toml.
type controlPlane struct {
	addr   string
	bundle *pki.Bundle
	// pids are the server's processes (several for replicas), none when
	// unknown (server columns stay empty).
	pids         []int
	started      bool
	dir          string
	renewalLimit int
	// debug is the server's debug_listen address, "" when unknown (the
	// heap columns stay empty).
	debug string

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	log     *tailBuffer

	adminConn *grpc.ClientConn
	admin     adminv1.AdminClient
	jwk       *pki.JoinEncryptionPublicKey
}

// trustDomain of the control plane the tool starts.
const (
	startedTrustDomain = "load.nodetrust.test"
	startedServerName  = "fleetd.load.test"
)

// findFleetd resolves --fleetd: the flag, else fleetd next to this
// executable, else fleetd in PATH.
func findFleetd(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "fleetd")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath("fleetd")
	if err != nil {
		return "", fmt.Errorf("no fleetd next to this program or in PATH (build both: go build -o bin/ ./cmd/...; or pass --fleetd PATH): %w", err)
	}
	return p, nil
}

// startControlPlane runs `fleetd init` and `fleetd serve` in a new
// temporary folder on a free loopback port, and returns once the server
// answers.
func startControlPlane(ctx context.Context, c *Config) (*controlPlane, error) {
	bin, err := findFleetd(c.Fleetd)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "nodetrust-load-")
	if err != nil {
		return nil, fmt.Errorf("make the control plane's folder: %w", err)
	}
	cp := &controlPlane{started: true, dir: dir, log: &tailBuffer{max: 64 << 10}, renewalLimit: max(6, c.Renewals+6)}
	pkiDir := filepath.Join(dir, "pki")
	initArgs := []string{"init", "--dir", pkiDir, "--trust-domain", startedTrustDomain, "--server-name", startedServerName, "--kem", c.KEM}
	if len(c.PKCS11) > 0 {
		// init reads the module and PIN file from the config.
		if err := cp.writeConfig(c, "127.0.0.1:0"); err != nil {
			cp.removeDir(c)
			return nil, err
		}
		initArgs = append(initArgs, "--config", filepath.Join(dir, "fleetd.toml"))
		for _, v := range c.PKCS11 {
			initArgs = append(initArgs, "--pkcs11", v)
		}
	}
	initCmd := exec.CommandContext(ctx, bin, initArgs...)
	if out, err := initCmd.CombinedOutput(); err != nil {
		cp.removeDir(c)
		return nil, fmt.Errorf("%s init: %w\n%s", bin, err, out)
	}
	if cp.bundle, err = pki.ReadBundle(filepath.Join(pkiDir, pki.BundleFile)); err != nil {
		cp.removeDir(c)
		return nil, err
	}
	// fleetd logs its address at info level; at warn it says nothing, so
	// the port is chosen here. Another program may take it in between: try
	// a few.
	for attempt := 1; ; attempt++ {
		err = cp.serve(ctx, bin, c)
		if err == nil {
			break
		}
		if attempt == 3 || ctx.Err() != nil {
			cp.removeDir(c)
			return nil, err
		}
	}
	if err := cp.connect(ctx, filepath.Join(dir, "pki")); err != nil {
		cp.stop(c)
		return nil, err
	}
	return cp, nil
}

func (cp *controlPlane) serve(ctx context.Context, bin string, c *Config) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	cp.addr = net.JoinHostPort("127.0.0.1", port)
	if port, err = freePort(); err != nil {
		return err
	}
	cp.debug = net.JoinHostPort("127.0.0.1", port)
	if err := cp.writeConfig(c, cp.addr); err != nil {
		return err
	}
	cmd := exec.Command(bin, "serve", "--config", filepath.Join(cp.dir, "fleetd.toml"))
	cmd.Stdout, cmd.Stderr = cp.log, cp.log
	// The server dies with the load tool, even when the tool is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s serve: %w", bin, err)
	}
	cp.cmd, cp.pids = cmd, []int{cmd.Process.Pid}
	cp.exited = make(chan struct{})
	go func() { cp.waitErr = cmd.Wait(); close(cp.exited) }()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for {
		conn, err := net.DialTimeout("tcp", cp.addr, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-cp.exited:
			return fmt.Errorf("fleetd serve exited before serving (%v):\n%s", cp.waitErr, cp.log)
		case <-deadline.C:
			cp.kill()
			return fmt.Errorf("fleetd serve did not listen on %s within 60s:\n%s", cp.addr, cp.log)
		case <-ctx.Done():
			cp.kill()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeConfig writes the started server's fleetd.toml.
func (cp *controlPlane) writeConfig(c *Config, listen string) error {
	cfgPath := filepath.Join(cp.dir, "fleetd.toml")
	// Every simulated node connects from 127.0.0.1: the one source may
	// hold a connection for each node (and each operation in flight).
	// fleetd's own total (16,384 by default) is raised too for a run
	// that holds more sessions.
	conns := c.Nodes + c.Concurrency + 64
	text := fmt.Sprintf("pki_dir = \"pki\"\ndata_dir = \"data\"\nlisten = %q\nlog_level = \"warn\"\n"+
		"renewal_limit = %d\nrenewal_window = \"1h\"\ntoken_ttl = \"12h\"\n[limits]\nmax_connections_per_source = %d\nmax_connections = %d\n",
		listen, cp.renewalLimit, conns, max(conns+64, 16384))
	if cp.debug != "" {
		text = fmt.Sprintf("debug_listen = %q\n", cp.debug) + text
	}
	if names, _, _ := c.keyExchanges(); len(names) > 0 {
		q := make([]string, len(names))
		for i, n := range names {
			q[i] = strconv.Quote(n)
		}
		text = fmt.Sprintf("tls_key_exchanges = [%s]\n", strings.Join(q, ", ")) + text
	}
	if c.PKCS11Module != "" || c.PKCS11PINFile != "" {
		text += fmt.Sprintf("[pkcs11]\nmodule = %q\npin_file = %q\n", c.PKCS11Module, c.PKCS11PINFile)
	}
	if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", cfgPath, err)
	}
	return nil
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	_, port, err := net.SplitHostPort(ln.Addr().String())
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	return port, nil
}

// targetControlPlane uses the running fleetd that c.ServerConfig names.
func targetControlPlane(ctx context.Context, c *Config, warn func(string, ...any)) (*controlPlane, error) {
	cfg, err := config.LoadFleetd(c.ServerConfig)
	if err != nil {
		return nil, err
	}
	pkiDir := cfg.Resolve(cfg.PKIDir)
	cp := &controlPlane{addr: cfg.AdminAddress(), renewalLimit: cfg.RenewalLimit, pids: c.ServerPIDs, debug: c.ServerDebug}
	if c.Server != "" {
		cp.addr = c.Server
	}
	if cp.bundle, err = pki.ReadBundle(filepath.Join(pkiDir, pki.BundleFile)); err != nil {
		return nil, err
	}
	if c.Renewals > cp.renewalLimit {
		warn("the server allows %d renewals per node in %s (renewal_limit), the run asks for %d: expect pushback errors", cp.renewalLimit, cfg.RenewalWindow.Duration, c.Renewals)
	}
	if len(cp.pids) == 0 {
		pid, err := findListenerPID(cp.first())
		if err != nil {
			warn("%v; server CPU and memory are not reported", err)
		} else {
			cp.pids = []int{pid}
		}
		if strings.Contains(cp.addr, ",") {
			warn("several --server addresses and one --server-pid found (the first's): the server columns count that replica only; pass --server-pid with every replica's")
		}
	}
	if err := cp.connect(ctx, pkiDir); err != nil {
		return nil, err
	}
	return cp, nil
}

// connect opens the admin connection with the owner credential in pkiDir
// and reads the join encryption key from the well-known document, checked
// against the bundle's pins, retrying until the server answers.
func (cp *controlPlane) connect(ctx context.Context, pkiDir string) error {
	cert, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, pki.OwnerCertFile), filepath.Join(pkiDir, pki.OwnerKeyFile))
	if err != nil {
		return fmt.Errorf("load the owner credential from %s: %w", pkiDir, err)
	}
	tc := tlspin.Client(cp.bundle.ServingCASPKIPin, cp.bundle.ServerName, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil })
	cp.adminConn, err = grpc.NewClient("passthrough:///"+cp.first(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return fmt.Errorf("dial fleetd at %s: %w", cp.first(), err)
	}
	cp.admin = adminv1.NewAdminClient(cp.adminConn)
	join := joinv1.NewJoinServiceClient(cp.adminConn)
	var resp *joinv1.GetWellKnownResponse
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err = join.GetWellKnown(cctx, &joinv1.GetWellKnownRequest{})
		cancel()
		if err == nil {
			break
		}
		if attempt == 50 || ctx.Err() != nil {
			return fmt.Errorf("fetch the well-known document from %s: %w", cp.first(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var doc struct {
		ServingCASPKIPin     string          `json:"serving_ca_spki_pin"`
		JoinSigningKeyPin    string          `json:"join_signing_key_pin"`
		JoinEncryptionKeyPin string          `json:"join_encryption_key_pin"`
		JoinEncryptionJWK    json.RawMessage `json:"join_encryption_jwk"`
	}
	if err := json.Unmarshal(resp.Document, &doc); err != nil {
		return fmt.Errorf("read the well-known document: %w", err)
	}
	if doc.ServingCASPKIPin != cp.bundle.ServingCASPKIPin.String() || doc.JoinSigningKeyPin != cp.bundle.JoinSigningKeyPin.String() ||
		doc.JoinEncryptionKeyPin != cp.bundle.JoinEncryptionKeyPin.String() {
		return errors.New("the well-known document's pins are not those of pki-bundle.json")
	}
	if cp.jwk, err = pki.ParseJWK(doc.JoinEncryptionJWK); err != nil {
		return fmt.Errorf("the well-known document's join encryption key: %w", err)
	}
	if cp.jwk.Pin() != cp.bundle.JoinEncryptionKeyPin {
		return errors.New("the join encryption key does not have join_encryption_key_pin")
	}
	return nil
}

// first is the first of the server's addresses: the one admin calls use
// and whose process the server columns measure.
func (cp *controlPlane) first() string {
	a, _, _ := strings.Cut(cp.addr, ",")
	return a
}

// alive reports whether a started server is still running.
func (cp *controlPlane) alive() bool {
	if !cp.started {
		return true
	}
	select {
	case <-cp.exited:
		return false
	default:
		return true
	}
}

func (cp *controlPlane) kill() {
	if cp.cmd != nil && cp.cmd.Process != nil {
		_ = cp.cmd.Process.Kill()
		<-cp.exited
	}
}

// stop closes the admin connection and, for a started server, ends it
// with SIGINT (SIGKILL after 15 s) and removes its folder. It returns an
// error when a started server did not exit cleanly.
func (cp *controlPlane) stop(c *Config) error {
	if cp.adminConn != nil {
		cp.adminConn.Close()
	}
	if !cp.started || cp.cmd == nil {
		return nil
	}
	defer cp.removeDir(c)
	_ = cp.cmd.Process.Signal(os.Interrupt)
	select {
	case <-cp.exited:
	case <-time.After(15 * time.Second):
		cp.kill()
		return fmt.Errorf("fleetd did not stop within 15s of SIGINT:\n%s", cp.log)
	}
	if cp.waitErr != nil {
		return fmt.Errorf("fleetd did not stop cleanly: %w\n%s", cp.waitErr, cp.log)
	}
	return nil
}

func (cp *controlPlane) removeDir(c *Config) {
	if cp.dir == "" {
		return
	}
	if c.Keep {
		c.warnf("the control plane's folder is kept: %s", cp.dir)
		return
	}
	_ = os.RemoveAll(cp.dir)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// heap reads the server's memory figures from its debug endpoint, after a
// garbage collection when gc is set.
func (cp *controlPlane) heap(gc bool) (debugserver.Memory, error) {
	var m debugserver.Memory
	if cp.debug == "" {
		return m, errors.New("no debug endpoint")
	}
	url := "http://" + cp.debug + "/debug/memory"
	if gc {
		url += "?gc=1"
	}
	client := http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return m, fmt.Errorf("read the server's heap: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("read the server's heap: %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&m); err != nil {
		return m, fmt.Errorf("read the server's heap: %w", err)
	}
	return m, nil
}
