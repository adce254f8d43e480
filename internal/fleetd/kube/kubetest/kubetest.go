package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Versions is the name of the folder under .deps/kube that
// scripts/kube-deps.sh builds into: Kubernetes, etcd and kwok's versions.
const Versions = "v1.37.2-etcdv3.6.16-kwokv0.8.0"

// readyTimeout bounds the wait for the API server to answer /readyz: about
// 3 s here, longer on a loaded machine.
const readyTimeout = 2 * time.Minute

// Cluster is a running control plane.
type Cluster struct {
	// URL is the API server's, https://127.0.0.1:port.
	URL string
	// CAPEM is the certificate of the CA that issued the API server's
	// serving certificate and that it trusts for client certificates; the
	// controller manager signs kubelet certificates with it.
	CAPEM []byte

	admin *rest.Config
	dir   string
	procs []*proc

	kwokOnce sync.Once
	kwokErr  error
}

// proc is a started binary and its log.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// errMissing marks a binary scripts/kube-deps.sh has not built.
var errMissing = errors.New("not built")

var shared struct {
	enabled bool
	once    sync.Once
	c       *Cluster
	err     error
}

// Main runs a test binary's tests with one control plane shared by every
// Start, started when the first test asks and stopped when the tests end.
// Call it from TestMain; it exits.
func Main(m *testing.M) {
	shared.enabled = true
	code := m.Run()
	if shared.c != nil {
		shared.c.stop()
	}
	os.Exit(code)
}

// Start returns a running control plane for t: the binary's shared one
// when TestMain called Main, else one started for t and stopped when t
// ends. Under CI a missing binary fails t; elsewhere it skips t.
func Start(t testing.TB) *Cluster {
	t.Helper()
	if shared.enabled {
		shared.once.Do(func() {
			dir, err := os.MkdirTemp("", "kubetest-")
			if err != nil {
				shared.err = err
				return
			}
			shared.c, shared.err = start(dir)
			if shared.c != nil {
				shared.c.dir = dir
			} else {
				os.RemoveAll(dir)
			}
		})
		check(t, shared.err)
		return shared.c
	}
	c, err := start(t.TempDir())
	if c != nil {
		t.Cleanup(c.stop)
	}
	check(t, err)
	return c
}

func check(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, errMissing) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	t.Fatal(err)
}

// BinDir is the folder scripts/kube-deps.sh builds the binaries into.
func BinDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..", ".deps", "kube", Versions, "bin")
}

func bin(name string) (string, error) {
	p := filepath.Join(BinDir(), name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s (%s) is %w: run scripts/kube-deps.sh (make deps does)", name, p, errMissing)
	}
	return p, nil
}

// AdminConfig returns a client configuration of a cluster administrator
// (group system:masters). Each call returns a new copy.
func (c *Cluster) AdminConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// Admin returns a client of a cluster administrator.
func (c *Cluster) Admin(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// BearerConfig returns a client configuration that authenticates with
// token alone: a bootstrap token ("<id>.<secret>") or a service account's.
func (c *Cluster) BearerConfig(token string) *rest.Config {
	return &rest.Config{Host: c.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.CAPEM}}
}

// CertConfig returns a client configuration that authenticates with a
// client certificate and its key, both PEM.
func (c *Cluster) CertConfig(certPEM, keyPEM []byte) *rest.Config {
	return &rest.Config{Host: c.URL, TLSClientConfig: rest.TLSClientConfig{CAData: c.CAPEM, CertData: certPEM, KeyData: keyPEM}}
}

// ServiceAccountConfig returns a client configuration that authenticates
// as the ServiceAccount namespace/name with a token the administrator
// requests for it (the TokenRequest API). The account must exist.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	admin, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return nil, err
	}
	tr, err := admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return c.BearerConfig(tr.Status.Token), nil
}

// Apply creates every object of a multi-document YAML manifest as the
// administrator, in order; an object that exists already is an error.
func (c *Cluster) Apply(ctx context.Context, manifest []byte) error {
	cfg := c.AdminConfig()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("decode manifest: %w", err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			r = dyn.Resource(m.Resource).Namespace(ns)
		}
		if _, err := r.Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
}

// start starts etcd, the API server and the controller manager with their
// files in dir, and waits until the API server is ready.
func start(dir string) (*Cluster, error) {
	etcd, err := bin("etcd")
	if err != nil {
		return nil, err
	}
	apiserver, err := bin("kube-apiserver")
	if err != nil {
		return nil, err
	}
	kcm, err := bin("kube-controller-manager")
	if err != nil {
		return nil, err
	}
	pki, err := newPKI(dir)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	c := &Cluster{URL: "https://127.0.0.1:" + ports[2], CAPEM: pki.caPEM, dir: dir}
	ok := false
	defer func() {
		if !ok {
			c.stop()
		}
	}()
	client, peer := "http://127.0.0.1:"+ports[0], "http://127.0.0.1:"+ports[1]
	if err := c.run(dir, etcd, "--name=kubetest", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=kubetest="+peer, "--log-level=warn"); err != nil {
		return nil, err
	}
	if err := c.run(dir, apiserver, "--etcd-servers="+client,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none", "--secure-port="+ports[2],
		"--tls-cert-file="+pki.serving, "--tls-private-key-file="+pki.servingKey,
		"--client-ca-file="+pki.ca,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pki.saPub, "--service-account-signing-key-file="+pki.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--enable-bootstrap-token-auth", "--authorization-mode=Node,RBAC",
		"--disable-admission-plugins=ServiceAccount"); err != nil {
		return nil, err
	}
	admin, err := pki.clientConfig(c.URL, "kubetest-admin", "system:masters")
	if err != nil {
		return nil, err
	}
	c.admin = admin
	if err := c.waitReady(); err != nil {
		return nil, err
	}
	kubeconfig, err := pki.kubeconfig(c.URL, "system:kube-controller-manager")
	if err != nil {
		return nil, err
	}
	if err := c.run(dir, kcm, "--kubeconfig="+kubeconfig, "--controllers=csrsigning",
		"--cluster-signing-cert-file="+pki.ca, "--cluster-signing-key-file="+pki.caKey,
		"--leader-elect=false", "--secure-port=0",
		// Each controller acts as its own ServiceAccount, as in a real
		// cluster: csrsigning as kube-system/certificate-controller.
		"--use-service-account-credentials=true"); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// LogTail returns the end of a binary's log (kube-apiserver,
// kube-controller-manager, etcd, kwok), for a failing test to show.
func (c *Cluster) LogTail(name string) string {
	return tail(filepath.Join(c.dir, name+".log"))
}

// StartKwok starts kwok, which plays the kubelet of every Node: Nodes
// become Ready, pods scheduled to them Running, and pods being deleted go
// away, so that evictions and drains complete. Once per cluster; it stops
// with the cluster.
func (c *Cluster) StartKwok(t testing.TB) {
	t.Helper()
	c.kwokOnce.Do(func() { c.kwokErr = c.startKwok() })
	check(t, c.kwokErr)
}

func (c *Cluster) startKwok() error {
	kwok, err := bin("kwok")
	if err != nil {
		return err
	}
	stages, err := filepath.Glob(filepath.Join(BinDir(), "..", "stage", "*.yaml"))
	if err != nil {
		return err
	}
	args := []string{"--manage-all-nodes=true"}
	for _, s := range stages {
		if filepath.Base(s) != "kustomization.yaml" {
			args = append(args, "--config="+s)
		}
	}
	if len(args) == 1 {
		return fmt.Errorf("kwok's stage files (%s) are %w: run scripts/kube-deps.sh (make deps does)", filepath.Join(BinDir(), "..", "stage"), errMissing)
	}
	p, err := loadPKI(c.dir)
	if err != nil {
		return err
	}
	kubeconfig, err := p.kubeconfig(c.URL, "kubetest-kwok", "system:masters")
	if err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	args = append(args, "--kubeconfig="+kubeconfig, "--server-address=127.0.0.1:"+ports[0], "--node-ip=127.0.0.1")
	return c.run(c.dir, kwok, args...)
}

// run starts a binary with args, its output in a log file in dir.
func (c *Cluster) run(dir, path string, args ...string) error {
	name := filepath.Base(path)
	p := &proc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		return err
	}
	p.cmd = exec.Command(path, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return nil
}

// waitReady polls the API server's /readyz until it answers ok, a process
// exits, or readyTimeout passes.
func (c *Cluster) waitReady() error {
	rc, err := rest.UnversionedRESTClientFor(withDefaults(c.AdminConfig()))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		for _, p := range c.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited before the API server was ready (%v): %s", p.name, p.err, tail(p.log))
			default:
			}
		}
		body, err := rc.Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API server was not ready after %s (%v): %s", readyTimeout, last, tail(c.procs[len(c.procs)-1].log))
		case <-tick.C:
		}
	}
}

// stop ends the processes, last started first, and removes a shared
// cluster's folder.
func (c *Cluster) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	c.procs = nil
	if shared.c == c && c.dir != "" {
		os.RemoveAll(c.dir)
	}
}

// tail returns the end of a log file, for an error.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]string, error) {
	var ports []string
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return ports, nil
}

func withDefaults(cfg *rest.Config) *rest.Config {
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return cfg
}

// pki holds the paths of a cluster's keys and certificates.
type pki struct {
	dir, ca, caKey, serving, servingKey, saKey, saPub string
	caPEM                                             []byte
	caCert                                            *x509.Certificate
	caSigner                                          *ecdsa.PrivateKey
}

func pkiPaths(dir string) *pki {
	d := filepath.Join(dir, "pki")
	return &pki{dir: d, ca: filepath.Join(d, "ca.crt"), caKey: filepath.Join(d, "ca.key"),
		serving: filepath.Join(d, "apiserver.crt"), servingKey: filepath.Join(d, "apiserver.key"),
		saKey: filepath.Join(d, "sa.key"), saPub: filepath.Join(d, "sa.pub")}
}

// newPKI makes a CA, the API server's serving certificate and the service
// account signing key in dir/pki.
func newPKI(dir string) (*pki, error) {
	p := pkiPaths(dir)
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubetest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if err := writeCertKey(p.ca, p.caKey, der, caKey); err != nil {
		return nil, err
	}
	if p, err = loadPKI(dir); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := p.issue(x509.Certificate{
		Subject: pkix.Name{CommonName: "kube-apiserver"}, DNSNames: []string{"localhost", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.serving, certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.servingKey, keyPEM, 0o600); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return nil, err
	}
	return p, os.WriteFile(p.saKey, keyPEMOf(saKey), 0o600)
}

// loadPKI reads the CA that newPKI made in dir.
func loadPKI(dir string) (*pki, error) {
	p := pkiPaths(dir)
	caPEM, err := os.ReadFile(p.ca)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(caPEM)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", p.ca)
	}
	if p.caCert, err = x509.ParseCertificate(block.Bytes); err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(p.caKey)
	if err != nil {
		return nil, err
	}
	if block, _ = pem.Decode(keyPEM); block == nil {
		return nil, fmt.Errorf("%s: no PEM block", p.caKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	var ok bool
	if p.caSigner, ok = k.(*ecdsa.PrivateKey); !ok {
		return nil, fmt.Errorf("%s: not an ECDSA key", p.caKey)
	}
	p.caPEM = caPEM
	return p, nil
}

// issue signs a certificate from tmpl with the CA for a new key, and
// returns both PEM.
func (p *pki) issue(tmpl x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial, now.Add(-time.Hour), now.Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, p.caCert, &key.PublicKey, p.caSigner)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEMOf(key), nil
}

// clientConfig issues a client certificate for user in groups and returns
// a configuration that uses it.
func (p *pki) clientConfig(url, user string, groups ...string) (*rest.Config, error) {
	certPEM, keyPEM, err := p.issue(x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	return &rest.Config{Host: url, TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM, CertData: certPEM, KeyData: keyPEM}}, nil
}

// kubeconfig writes a kubeconfig file for user in groups and returns its
// path.
func (p *pki) kubeconfig(url, user string, groups ...string) (string, error) {
	cfg, err := p.clientConfig(url, user, groups...)
	if err != nil {
		return "", err
	}
	path := filepath.Join(p.dir, user+".kubeconfig")
	return path, os.WriteFile(path, kubeconfigFile(cfg), 0o600)
}

// kubeconfigFile renders cfg, which carries PEM data, as a kubeconfig.
func kubeconfigFile(cfg *rest.Config) []byte {
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: user
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: kubetest
  context: {cluster: kubetest, user: user}
current-context: kubetest
`, cfg.Host, b64(cfg.CAData), b64(cfg.CertData), b64(cfg.KeyData))
}

func writeCertKey(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyPath, keyPEMOf(key), 0o600)
}

func keyPEMOf(key *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		panic(err) // an ECDSA P-256 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}
