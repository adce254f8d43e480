package doctor

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/fileperm"
	"github.com/nodetrust/nodetrust/pki/pkitest"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// nodeCert returns a self-signed node certificate for nodeID and key, valid
// from notBefore to notAfter, as DER.
func nodeCert(t *testing.T, nodeID string, key *ecdsa.PrivateKey, notBefore, notAfter time.Time) []byte {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: nodeID},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{{Scheme: "spiffe", Host: "nodetrust.test", Path: "/node/" + nodeID}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func leafCert(t *testing.T, nodeID string, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(nodeCert(t, nodeID, pkitest.NewKey(t), notBefore, notAfter))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func keyPEM(t *testing.T, k crypto.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: identity.PEMTypeFileKey, Bytes: der})
}

// persisted stores an identity for web-01 in a new data directory with the
// node key stored, and returns the directory. A stored key other than the
// certified one gives a real key mismatch.
func persisted(t *testing.T, certified, stored *ecdsa.PrivateKey) string {
	t.Helper()
	dir := t.TempDir()
	der := nodeCert(t, "web-01", certified, t0.Add(-time.Hour), t0.Add(23*time.Hour))
	id := identity.Identity{
		NodeID:  "web-01",
		KeyKind: identity.KeyKindFile,
		Chain:   [][]byte{der},
		Roots:   [][]byte{der},
	}
	if err := identity.Persist(dir, id, keyPEM(t, stored), t0); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loaded runs identity.LoadState on dir, as bcd doctor does.
func loaded(dir string) (*x509.Certificate, error) {
	st, err := identity.LoadState(dir, identity.LoadOptions{})
	if err != nil {
		return nil, err
	}
	return st.Leaf, nil
}

// check asserts a result's name, status, a substring of its message, and its
// fix.
func check(t *testing.T, got Result, name string, status Status, msgPart, fix string) {
	t.Helper()
	if got.Name != name {
		t.Errorf("Name = %q, want %q", got.Name, name)
	}
	if got.Status != status {
		t.Errorf("Status = %v, want %v (message %q)", got.Status, status, got.Message)
	}
	if !strings.Contains(got.Message, msgPart) {
		t.Errorf("Message = %q, want it to contain %q", got.Message, msgPart)
	}
	if got.Fix != fix {
		t.Errorf("Fix = %q, want %q", got.Fix, fix)
	}
}

var rejoin = identity.WayBack("token")

func TestCheckIdentity(t *testing.T) {
	k := pkitest.NewKey(t)
	good := persisted(t, k, k)
	goodLeaf, err := loaded(good)
	if err != nil {
		t.Fatal(err)
	}
	_, errMismatch := loaded(persisted(t, k, pkitest.NewKey(t)))
	if !errors.Is(errMismatch, identity.ErrKeyMismatch) {
		t.Fatalf("setup: want a key mismatch, got %v", errMismatch)
	}
	empty := t.TempDir()
	_, errNotJoined := loaded(empty)
	corrupt := t.TempDir()
	if err := os.WriteFile(filepath.Join(corrupt, datadir.IdentityFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errCorrupt := loaded(corrupt)
	errPerm := fmt.Errorf("read identity: %w", &fs.PathError{Op: "open", Path: "/var/lib/bcd/identity.json", Err: fs.ErrPermission})

	tests := []struct {
		name    string
		dir     string
		loadErr error
		leaf    *x509.Certificate
		now     time.Time
		status  Status
		msg     string
		fix     string
	}{
		{"joined", good, nil, goodLeaf, t0, Pass,
			"joined as web-01 until 2026-03-02T11:00:00Z", ""},
		{"not joined", empty, errNotJoined, nil, t0, Warn,
			"this node has not joined (no identity.json in " + empty + ")", "run bcd join (with the token on standard input)"},
		{"not joined, wrapped again", "", fmt.Errorf("load: %w", identity.ErrNotJoined), nil, t0, Warn,
			"this node has not joined", "run bcd join (with the token on standard input)"},
		{"corrupt identity", corrupt, errCorrupt, nil, t0, Fail,
			"identity.json is corrupt", rejoin},
		{"key mismatch", good, errMismatch, nil, t0, Fail,
			"the node key does not match the node certificate", rejoin},
		{"unreadable", "/var/lib/bcd", errPerm, nil, t0, Fail,
			"permission denied", "run bcd doctor as root or as the user /var/lib/bcd belongs to"},
		{"expired", good, nil, goodLeaf, t0.Add(24 * time.Hour), Fail,
			"the node certificate expired at 2026-03-02T11:00:00Z", rejoin},
		{"not yet valid", good, nil, goodLeaf, t0.Add(-2 * time.Hour), Warn,
			"valid only from 2026-03-01T11:00:00Z",
			"synchronise the clock (chrony or systemd-timesyncd), then run bcd doctor again"},
		{"no certificate", good, nil, nil, t0, Fail, "no node certificate", rejoin},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckIdentity(IdentityFacts{DataDir: tc.dir, LoadErr: tc.loadErr, Leaf: tc.leaf, Now: tc.now})
			check(t, got, NameIdentity, tc.status, tc.msg, tc.fix)
			if strings.Contains(got.Message, "join again:") {
				t.Errorf("Message %q repeats the way back the Fix gives", got.Message)
			}
		})
	}
}

func TestCheckIdentityExpiresAtNotAfter(t *testing.T) {
	leaf := leafCert(t, "web-02", t0.Add(-time.Hour), t0)
	check(t, CheckIdentity(IdentityFacts{Leaf: leaf, Now: t0}), NameIdentity, Pass, "joined as web-02 until 2026-03-01T12:00:00Z", "")
	check(t, CheckIdentity(IdentityFacts{Leaf: leaf, Now: t0.Add(time.Second)}), NameIdentity, Fail,
		"expired at 2026-03-01T12:00:00Z", rejoin)
}

func TestCheckIdentityRevokedAndTheTPMWayBack(t *testing.T) {
	leaf := leafCert(t, "web-03", t0.Add(-time.Hour), t0.Add(time.Hour))
	rv := &Revocation{Time: t0.Add(-time.Minute), Detail: "disk stolen"}
	check(t, CheckIdentity(IdentityFacts{Leaf: leaf, Now: t0, Revoked: rv}), NameIdentity, Fail,
		"the control plane revoked the certificate of node web-03 at 2026-03-01T11:59:00Z (disk stolen); it can never renew", rejoin)
	// A node that joined with its TPM is sent back to the TPM, which
	// needs no token.
	check(t, CheckIdentity(IdentityFacts{Leaf: leaf, Now: t0, Revoked: rv, Attestor: "tpm"}), NameIdentity, Fail,
		"revoked", "bcd join --reset --yes --attestor tpm")
	check(t, CheckIdentity(IdentityFacts{Leaf: leaf, Now: t0.Add(2 * time.Hour), Attestor: "tpm"}), NameIdentity, Fail,
		"expired at", "bcd join --reset --yes --attestor tpm")
	refused := &Revocation{Time: t0, Refused: true, Detail: "node certificate refused: certificate 01 was revoked"}
	check(t, CheckIdentity(IdentityFacts{Leaf: leaf, Now: t0, Revoked: refused}), NameIdentity, Fail,
		"the control plane refused the certificate of node web-03", rejoin)
}

func TestCheckPermissions(t *testing.T) {
	check(t, CheckPermissions("the data directory", nil, "", 0), NamePermissions, Pass, "the data directory not writable by others", "")
	pr := &fileperm.Problem{What: "the data directory", Path: "/var/lib/bcd", Why: "is writable by others (mode 0777)", Fix: "chmod 0700 /var/lib/bcd"}
	check(t, CheckPermissions("the data directory", []error{nil, pr}, "", 0), NamePermissions, Fail,
		"the data directory /var/lib/bcd is writable by others (mode 0777)", "chmod 0700 /var/lib/bcd")
	check(t, CheckPermissions("the data directory", nil, "/etc/bcd/join-token", 0o644), NamePermissions, Warn,
		"the join token /etc/bcd/join-token is readable by others (mode 0644)", "chmod 600 /etc/bcd/join-token, or remove it once the machine has joined")
}

func TestCheckConfig(t *testing.T) {
	const path = "/etc/bcd/config.toml"
	_, errMissing := os.ReadFile(filepath.Join(t.TempDir(), "config.toml"))
	tests := []struct {
		name    string
		loadErr error
		status  Status
		msg     string
		fix     string
	}{
		{"valid", nil, Pass, "config /etc/bcd/config.toml and its pins are valid", ""},
		{"missing", fmt.Errorf("read config: %w", errMissing), Warn, "does not exist",
			"write /etc/bcd/config.toml with the install script, or pass --server and the three pins to bcd join"},
		{"bad pin", errors.New(`serving_ca_spki_pin: "sha256:zz" is not a valid pin`), Fail,
			"serving_ca_spki_pin", "correct the setting named above in /etc/bcd/config.toml"},
		{"unreadable", &fs.PathError{Op: "open", Path: path, Err: fs.ErrPermission}, Fail,
			"permission denied", "run bcd doctor as root or as a user that can read /etc/bcd/config.toml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check(t, CheckConfig(path, tc.loadErr), NameConfig, tc.status, tc.msg, tc.fix)
		})
	}
}

func TestCheckClock(t *testing.T) {
	const fixClock = "synchronise the clock (chrony or systemd-timesyncd), then run bcd doctor again"
	tests := []struct {
		name   string
		offset time.Duration
		err    error
		status Status
		msg    string
		fix    string
	}{
		{"in sync", 120 * time.Millisecond, nil, Pass, "clock within 120ms of the control plane", ""},
		{"5 s behind", -5 * time.Second, nil, Pass, "clock within 5s of the control plane", ""},
		{"just over 5 s ahead", 5*time.Second + time.Millisecond, nil, Warn, "the clock is 5.001s ahead of the control plane", fixClock},
		{"30 s behind", -30 * time.Second, nil, Warn, "the clock is 30s behind the control plane", fixClock},
		{"31 s ahead", 31 * time.Second, nil, Fail, "certificates and signed calls fail beyond 30 s", fixClock},
		{"far behind", -2 * time.Hour, nil, Fail, "the clock is 2h0m0s behind", fixClock},
		{"most negative", time.Duration(-1 << 63), nil, Fail, "behind", fixClock},
		{"no answer", 0, errors.New("connection refused"), Fail,
			"cannot read the control plane's time: connection refused",
			"check the control plane is reachable (see the reachability check)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check(t, CheckClock(tc.offset, tc.err), NameClock, tc.status, tc.msg, tc.fix)
		})
	}
}

func TestCheckReachable(t *testing.T) {
	const server = "fleet.example.test:443"
	const fixPin = "check serving_ca_spki_pin against the control plane's pki-bundle.json"
	tests := []struct {
		name   string
		err    error
		status Status
		msg    string
		fix    string
	}{
		{"answers", nil, Pass, "control plane fleet.example.test:443 answers over TLS pinned to serving_ca_spki_pin", ""},
		{"pin mismatch",
			fmt.Errorf("dial: %w", fmt.Errorf("%w (pin sha256:abc); "+fixPin, tlspin.ErrPinMismatch)),
			Fail, "does not contain the pinned serving CA (pin sha256:abc)", fixPin},
		{"wrong control plane",
			fmt.Errorf("the control plane at fleet.example.test:443 is not the one the pins name: %w", fmt.Errorf("%w: bad signature", tlspin.ErrUntrusted)),
			Fail, "not the one the pins name", fixPin},
		{"a message that only mentions a pin is not a pin problem",
			errors.New("dial tcp: lookup pinned serving CA: no such host"), Fail,
			"cannot reach the control plane fleet.example.test:443", "check that fleet.example.test:443 is reachable from this machine (firewall, DNS) and that fleetd is running"},
		{"refused", errors.New("dial tcp 192.0.2.1:443: connect: connection refused"), Fail,
			"cannot reach the control plane fleet.example.test:443: dial tcp 192.0.2.1:443: connect: connection refused",
			"check that fleet.example.test:443 is reachable from this machine (firewall, DNS) and that fleetd is running"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckReachable(server, tc.err)
			check(t, got, NameReachable, tc.status, tc.msg, tc.fix)
			if tc.status != Pass && strings.Count(got.Message+got.Fix, fixPin) > 1 {
				t.Errorf("Message %q repeats the Fix", got.Message)
			}
		})
	}
}

func TestStatusString(t *testing.T) {
	for s, want := range map[Status]string{Pass: "pass", Warn: "warn", Fail: "fail", Status(7): "Status(7)"} {
		if got := s.String(); got != want {
			t.Errorf("Status(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}

func TestWorstAndExitCode(t *testing.T) {
	pass := Result{Name: "a", Status: Pass}
	warn := Result{Name: "b", Status: Warn}
	fail := Result{Name: "c", Status: Fail}
	tests := []struct {
		rs    []Result
		worst Status
		code  int
	}{
		{nil, Pass, 0},
		{[]Result{pass, pass}, Pass, 0},
		{[]Result{pass, warn, pass}, Warn, 3},
		{[]Result{fail, warn, pass}, Fail, 1},
		{[]Result{warn, fail}, Fail, 1},
	}
	for _, tc := range tests {
		w := Worst(tc.rs)
		if w != tc.worst {
			t.Errorf("Worst(%v) = %v, want %v", tc.rs, w, tc.worst)
		}
		if c := ExitCode(w); c != tc.code {
			t.Errorf("ExitCode(%v) = %d, want %d", w, c, tc.code)
		}
	}
	if c := ExitCode(Status(9)); c != 1 {
		t.Errorf("ExitCode of an unknown status = %d, want 1", c)
	}
}

func TestPrint(t *testing.T) {
	rs := []Result{
		{Name: NameIdentity, Status: Pass, Message: "joined as web-01 until 2026-03-02T11:00:00Z"},
		{Name: NameClock, Status: Warn, Message: "the clock is 12s ahead of the control plane, more than 5s",
			Fix: "synchronise the clock (chrony or systemd-timesyncd), then run bcd doctor again"},
		{Name: NameReachable, Status: Fail, Message: "cannot reach the control plane x:443:\nconnection refused",
			Fix: "check that x:443 is reachable"},
	}
	var b bytes.Buffer
	Print(&b, rs)
	want := "" +
		"pass  identity      joined as web-01 until 2026-03-02T11:00:00Z\n" +
		"warn  clock         the clock is 12s ahead of the control plane, more than 5s\n" +
		"    → synchronise the clock (chrony or systemd-timesyncd), then run bcd doctor again\n" +
		"fail  reachability  cannot reach the control plane x:443: connection refused\n" +
		"    → check that x:443 is reachable\n"
	if got := b.String(); got != want {
		t.Errorf("Print wrote\n%s\nwant\n%s", got, want)
	}

	b.Reset()
	Print(&b, []Result{CheckIdentity(IdentityFacts{LoadErr: fmt.Errorf("%w", identity.ErrNotJoined), Now: t0})})
	if got, want := b.String(), "warn  identity  this node has not joined\n    → run bcd join (with the token on standard input)\n"; got != want {
		t.Errorf("Print wrote %q, want %q", got, want)
	}
}

func TestCheckTPM(t *testing.T) {
	cases := []struct {
		name string
		f    TPMFacts
		want Status
		msg  string
		fix  string
	}{
		{"a file key without a helper passes and says where the key is", TPMFacts{KeyWhere: "file /var/lib/bcd/node.key"}, Pass, "node key: file /var/lib/bcd/node.key", ""},
		{"a helper user outside tss passes", TPMFacts{KeyWhere: "TPM through bcd helper (/run/bcd/helper.sock)", HelperUser: "bcd"}, Pass, "TPM through bcd helper", ""},
		{"a helper user in tss fails with the way back", TPMFacts{KeyWhere: "TPM through bcd helper (/run/bcd/helper.sock)", HelperUser: "bcd", HelperUserInTSS: true}, Fail, "is in the tss group", "gpasswd -d bcd tss"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := CheckTPM(tc.f)
			if r.Status != tc.want || !strings.Contains(r.Message, tc.msg) || !strings.Contains(r.Fix, tc.fix) || (tc.fix == "" && r.Fix != "") {
				t.Errorf("CheckTPM = %+v", r)
			}
		})
	}
}
