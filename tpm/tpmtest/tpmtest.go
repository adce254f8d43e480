// Package tpmtest helps tests use real TPMs: it starts swtpm, the software
// TPM, on a free loopback port with EK certificates from a private CA;
// opens the in-process simulator (OpenSim, build tag tpmsim); plays a TPM
// manufacturer (a CA that issues EK certificates as the TCG profile says,
// and writes them to NV); makes credential-activation challenges as a
// verifier does; and builds the measurement logs firmware writes (EventLog)
// and extends them into a TPM, so that a test can measure a boot of its
// choosing and quote it. It is for tests only; nothing in a release binary imports
// it.
package tpmtest

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/nodetrust/nodetrust/tpm"
)

// Swtpm is a running swtpm started by [StartSwtpm].
type Swtpm struct {
	// Dir holds the TPM state, the local CA (Dir/localca) and the logs.
	Dir string
	// Port is the TPM command port on 127.0.0.1; Port+1 is the control port.
	Port int

	rsaKeySize int
}

// Spec returns the tpm setting that opens this swtpm with [tpm.Open].
func (s *Swtpm) Spec() string { return fmt.Sprintf("tcp://127.0.0.1:%d", s.Port) }

// Open opens the swtpm and closes it when the test ends. swtpm serves one
// connection at a time: close this one before opening another.
func (s *Swtpm) Open(t testing.TB) *tpm.TPM {
	t.Helper()
	tp, err := tpm.Open(s.Spec())
	if err != nil {
		t.Fatalf("open swtpm: %v", err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	return tp
}

// OpenRaw opens the swtpm on a connection of its own and returns it both
// as a [tpm.TPM] and as the raw transport under it, for the commands a
// test sends itself (as the TPM's manufacturer: NV writes with platform
// authorization). It is closed when the test ends; close it before opening
// another.
func (s *Swtpm) OpenRaw(t testing.TB) (*tpm.TPM, transport.TPMCloser) {
	t.Helper()
	tr := s.raw(t)
	tp := tpm.New(tr, tr)
	t.Cleanup(func() { _ = tp.Close() })
	return tp, tr
}

// IssuerCertificate returns the local CA's certificate that signed the EK
// certificates, and RootCertificate the root above it.
func (s *Swtpm) IssuerCertificate(t testing.TB) *x509.Certificate {
	t.Helper()
	return readCert(t, filepath.Join(s.Dir, "localca", "issuercert.pem"))
}

// RootCertificate returns the local CA's root certificate.
func (s *Swtpm) RootCertificate(t testing.TB) *x509.Certificate {
	t.Helper()
	return readCert(t, filepath.Join(s.Dir, "localca", "swtpm-localca-rootca-cert.pem"))
}

func readCert(t testing.TB, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// debianPackages maps each Debian package the swtpm tests need to a command
// it installs.
var debianPackages = []struct{ pkg, cmd string }{
	{"swtpm", "swtpm"},
	{"swtpm-tools", "swtpm_setup"},
	{"tpm2-tools", "tpm2_checkquote"},
}

// MissingPackages returns the Debian packages of swtpm, swtpm-tools and
// tpm2-tools whose commands are not on PATH.
func MissingPackages() []string {
	var missing []string
	for _, p := range debianPackages {
		if _, err := exec.LookPath(p.cmd); err != nil {
			missing = append(missing, p.pkg)
		}
	}
	return missing
}

// RequireSwtpm skips the test when swtpm is not installed, except under CI
// (CI=true), where it fails naming the Debian packages to install.
func RequireSwtpm(t testing.TB) {
	t.Helper()
	missing := MissingPackages()
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("swtpm tests need the Debian packages %s (scripts/swtpm-deps.sh installs them)", strings.Join(missing, " "))
	}
	t.Skipf("swtpm not installed (Debian packages %s; scripts/swtpm-deps.sh)", strings.Join(missing, " "))
}

// StartSwtpm starts a freshly provisioned swtpm in a t.TempDir() on a free
// loopback port with scripts/swtpm-start.sh, and stops it when the test ends.
// It calls [RequireSwtpm] first.
func StartSwtpm(t testing.TB) *Swtpm { t.Helper(); return startSwtpm(t, 2048) }

// StartSwtpmRSA3072 is [StartSwtpm] with swtpm_setup --rsa-keysize 3072:
// the RSA EK is RSA 3072 (template H-6), certified at NV 0x01C0001C, and
// the TPM has no RSA 2048 EK certificate.
func StartSwtpmRSA3072(t testing.TB) *Swtpm { t.Helper(); return startSwtpm(t, 3072) }

func startSwtpm(t testing.TB, rsaKeySize int) *Swtpm {
	t.Helper()
	RequireSwtpm(t)
	script, err := scriptPath("swtpm-start.sh")
	if err != nil {
		t.Fatal(err)
	}
	stop, err := scriptPath("swtpm-stop.sh")
	if err != nil {
		t.Fatal(err)
	}
	s := &Swtpm{Dir: t.TempDir(), rsaKeySize: rsaKeySize}
	s.start(t, script)
	t.Cleanup(func() {
		if out, err := exec.Command("bash", stop, s.Dir).CombinedOutput(); err != nil {
			t.Errorf("stop swtpm: %v\n%s", err, out)
		}
	})
	return s
}

// start runs scripts/swtpm-start.sh on a free port pair, trying others when
// a port was taken in between.
func (s *Swtpm) start(t testing.TB, script string) {
	t.Helper()
	var lastErr error
	for range 5 {
		port, err := freePortPair()
		if err != nil {
			t.Fatal(err)
		}
		args := []string{script, s.Dir, fmt.Sprint(port)}
		if s.rsaKeySize != 0 {
			args = append(args, fmt.Sprint(s.rsaKeySize))
		}
		out, err := exec.Command("bash", args...).CombinedOutput()
		if err == nil {
			s.Port = port
			return
		}
		lastErr = fmt.Errorf("%s %s %d: %v\n%s", script, s.Dir, port, err, out)
	}
	t.Fatalf("start swtpm: %v", lastErr)
}

// Twin starts a second swtpm on a copy of s's state: the same seeds, so
// the same EK, EK certificates and keys, as a TPM whose state was copied
// would have. Nothing may use s while its state is copied. The twin stops
// when the test ends.
func (s *Swtpm) Twin(t testing.TB) *Swtpm {
	t.Helper()
	script, err := scriptPath("swtpm-start.sh")
	if err != nil {
		t.Fatal(err)
	}
	stop, err := scriptPath("swtpm-stop.sh")
	if err != nil {
		t.Fatal(err)
	}
	tw := &Swtpm{Dir: t.TempDir()}
	err = filepath.WalkDir(s.Dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(s.Dir, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(tw.Dir, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o700)
		case !d.Type().IsRegular(), strings.HasSuffix(d.Name(), ".pid"), strings.HasSuffix(d.Name(), ".lock"), strings.HasSuffix(d.Name(), ".log"):
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o600)
	})
	if err != nil {
		t.Fatalf("copy the swtpm state: %v", err)
	}
	tw.start(t, script)
	t.Cleanup(func() {
		if out, err := exec.Command("bash", stop, tw.Dir).CombinedOutput(); err != nil {
			t.Errorf("stop swtpm: %v\n%s", err, out)
		}
	})
	return tw
}

// Restart stops swtpm and starts it again on the same state, as a reboot
// does: the TPM keeps its seeds and NV, and loses its transient objects and
// PCR values. The port may change.
func (s *Swtpm) Restart(t testing.TB) {
	t.Helper()
	script, err := scriptPath("swtpm-start.sh")
	if err != nil {
		t.Fatal(err)
	}
	stop, err := scriptPath("swtpm-stop.sh")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("bash", stop, s.Dir).CombinedOutput(); err != nil {
		t.Fatalf("stop swtpm: %v\n%s", err, out)
	}
	s.start(t, script)
}

// scriptPath finds scripts/NAME of this module from this source file.
func scriptPath(name string) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("tpmtest: cannot locate the module's scripts folder")
	}
	p := filepath.Join(filepath.Dir(file), "..", "..", "scripts", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("tpmtest: %w", err)
	}
	return p, nil
}

// freePortPair returns a port P on 127.0.0.1 such that P and P+1 were free.
func freePortPair() (int, error) {
	for range 100 {
		l1, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l1.Addr().(*net.TCPAddr).Port
		if port >= 65535 {
			l1.Close()
			continue
		}
		l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+1))
		l1.Close()
		if err == nil {
			l2.Close()
			return port, nil
		}
	}
	return 0, errors.New("no two adjacent free ports on 127.0.0.1")
}

// MakeCredential makes a credential-activation challenge as a verifier does
// (MakeCredential, TPM 2.0 Part 1, section 24), in pure Go with go-tpm's
// tpm2.CreateCredential: secret, sealed to the EK whose TPMT_PUBLIC is
// ekPublicArea and bound to the AK name akName. Pass the results to
// [tpm.TPM.ActivateCredential]; the TPM releases secret only to that AK in
// that EK's TPM.
func MakeCredential(ekPublicArea, akName, secret []byte) (credentialBlob, encryptedSecret []byte, err error) {
	pub, err := tpm2.Unmarshal[tpm2.TPMTPublic](ekPublicArea)
	if err != nil {
		return nil, nil, fmt.Errorf("EK public area: %w", err)
	}
	key, err := tpm2.ImportEncapsulationKey(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("EK public area: %w", err)
	}
	return tpm2.CreateCredential(rand.Reader, key, akName, secret)
}

// LoadedHandles counts the transient objects and the loaded sessions (HMAC
// and policy) in the TPM behind tr, with TPM2_GetCapability(TPM_CAP_HANDLES)
// (TPM 2.0 Part 3, section 30.2). Tests use it to prove that nothing leaked.
func LoadedHandles(tr transport.TPM) (objects, sessions int, err error) {
	count := func(ht tpm2.TPMHT) (int, error) {
		rsp, err := tpm2.GetCapability{
			Capability:    tpm2.TPMCapHandles,
			Property:      uint32(ht) << 24,
			PropertyCount: 64,
		}.Execute(tr)
		if err != nil {
			return 0, fmt.Errorf("TPM2_GetCapability of handles %#x: %w", uint32(ht)<<24, err)
		}
		h, err := rsp.CapabilityData.Data.Handles()
		if err != nil {
			return 0, err
		}
		n := 0
		for _, x := range h.Handle {
			if tpm2.TPMHT(x>>24) == ht {
				n++
			}
		}
		return n, nil
	}
	if objects, err = count(tpm2.TPMHTTransient); err != nil {
		return 0, 0, err
	}
	for _, ht := range []tpm2.TPMHT{tpm2.TPMHTHMACSession, tpm2.TPMHTPolicySession} {
		n, err := count(ht)
		if err != nil {
			return 0, 0, err
		}
		sessions += n
	}
	return objects, sessions, nil
}

// Handles counts the transient objects and sessions loaded in the swtpm, on
// a connection of its own: close every other connection first, since swtpm
// serves one at a time.
func (s *Swtpm) Handles(t testing.TB) (objects, sessions int) {
	t.Helper()
	tr := s.raw(t)
	defer tr.Close()
	objects, sessions, err := LoadedHandles(tr)
	if err != nil {
		t.Fatal(err)
	}
	return objects, sessions
}
