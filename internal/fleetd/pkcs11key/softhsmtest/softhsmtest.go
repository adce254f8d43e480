// Package softhsmtest gives tests real PKCS#11 tokens: SoftHSM2 (Debian
// package softhsm2) with a private configuration and token folder per
// test, a PIN file, and a way to make a token go away and come back while a
// program uses it. It is test support for fleetd's PKCS#11 keys; nothing
// in a release binary imports it.
package softhsmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Module is the SoftHSM2 PKCS#11 library Debian installs.
const Module = "/usr/lib/softhsm/libsofthsm2.so"

// PIN is the user PIN of every token made here; SOPIN its security
// officer's.
const (
	PIN   = "4711-test"
	SOPIN = "0815-test-so"
)

// SoftHSM is one private SoftHSM2 configuration: a softhsm2.conf whose
// token folder is inside a test's temporary folder. A process reads it
// through the SOFTHSM2_CONF environment variable ([SoftHSM.Env]).
type SoftHSM struct {
	Dir  string
	Conf string
	// PINFile holds PIN, mode 0600.
	PINFile   string
	tokensDir string
}

// Token is one initialized token of a SoftHSM.
type Token struct {
	Label string
	// Dir is the token's folder under the token folder.
	Dir string
	// away is where Remove moved it.
	away string
}

// Require skips the test when SoftHSM2 is not installed, except under CI
// (CI=true), where it fails naming the Debian package.
func Require(t testing.TB) {
	t.Helper()
	_, errUtil := exec.LookPath("softhsm2-util")
	_, errMod := os.Stat(Module)
	if errUtil == nil && errMod == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("PKCS#11 tests need SoftHSM2: the Debian package softhsm2 (scripts/deps.sh installs it as root)")
	}
	t.Skip("SoftHSM2 not installed (Debian package softhsm2; scripts/deps.sh as root)")
}

// New makes a private SoftHSM2 configuration in a t.TempDir(). It calls
// [Require] first.
func New(t testing.TB) *SoftHSM {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	s := &SoftHSM{Dir: dir, Conf: filepath.Join(dir, "softhsm2.conf"), PINFile: filepath.Join(dir, "pin"), tokensDir: filepath.Join(dir, "tokens")}
	if err := os.Mkdir(s.tokensDir, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n", s.tokensDir)
	if err := os.WriteFile(s.Conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.PINFile, []byte(PIN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// Env is the environment entry that points SoftHSM2 at this configuration.
func (s *SoftHSM) Env() string { return "SOFTHSM2_CONF=" + s.Conf }

// Setenv points this process's SoftHSM2 at this configuration for the
// test. SoftHSM2 reads it when the module is initialized, so the test must
// close every connection it opens before it ends.
func (s *SoftHSM) Setenv(t *testing.T) {
	t.Helper()
	t.Setenv("SOFTHSM2_CONF", s.Conf)
}

// InitToken initializes a new token labelled label with [PIN].
func (s *SoftHSM) InitToken(t testing.TB, label string) *Token {
	t.Helper()
	before := s.tokenDirs(t)
	cmd := exec.Command("softhsm2-util", "--init-token", "--free", "--label", label, "--so-pin", SOPIN, "--pin", PIN)
	cmd.Env = append(os.Environ(), s.Env())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("softhsm2-util --init-token: %v\n%s", err, out)
	}
	var made []string
	for _, d := range s.tokenDirs(t) {
		if !slices.Contains(before, d) {
			made = append(made, d)
		}
	}
	if len(made) != 1 {
		t.Fatalf("softhsm2-util made %d token folders, want 1", len(made))
	}
	return &Token{Label: label, Dir: filepath.Join(s.tokensDir, made[0])}
}

func (s *SoftHSM) tokenDirs(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(s.tokensDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// URI is a PKCS#11 URI of the token with the module and PIN file as query
// attributes, plus the path attributes extra ("object=x").
func (s *SoftHSM) URI(tok *Token, extra ...string) string {
	path := append([]string{"token=" + tok.Label}, extra...)
	return "pkcs11:" + strings.Join(path, ";") + "?module-path=" + Module + "&pin-source=" + s.PINFile
}

// Remove makes the token go away while programs use it, as an unplugged
// token does: its folder moves out of SoftHSM2's token folder, so its
// objects vanish (signing fails with CKR_OBJECT_HANDLE_INVALID, and a new
// connection does not find the token). [Token.Restore] brings it back.
func (tok *Token) Remove(t testing.TB) {
	t.Helper()
	// Out of the token folder: SoftHSM2 takes every folder in it for a
	// token, whatever its name.
	tok.away = filepath.Join(filepath.Dir(filepath.Dir(tok.Dir)), "away-"+filepath.Base(tok.Dir))
	if err := os.Rename(tok.Dir, tok.away); err != nil {
		t.Fatalf("remove token %s: %v", tok.Label, err)
	}
}

// Restore puts a removed token back where SoftHSM2 finds it.
func (tok *Token) Restore(t testing.TB) {
	t.Helper()
	if tok.away == "" {
		t.Fatal("restore: the token was not removed")
	}
	if err := os.Rename(tok.away, tok.Dir); err != nil {
		t.Fatalf("restore token %s: %v", tok.Label, err)
	}
	tok.away = ""
}

// ObjectFiles returns the number of objects the token holds: SoftHSM2
// keeps each in a file of its own beside token.object. A test sees with
// it that keys were made inside the token.
func (tok *Token) ObjectFiles(t testing.TB) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(tok.Dir, "*.object"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range m {
		if filepath.Base(p) != "token.object" {
			n++
		}
	}
	return n
}
