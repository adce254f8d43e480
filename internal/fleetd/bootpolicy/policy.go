package bootpolicy

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Errors callers branch on.
var (
	// ErrUnknownClass: no policy file names the class. A caller must refuse
	// the node, never accept it without a policy.
	ErrUnknownClass = errors.New("bootpolicy: no boot policy for this machine class")
	// ErrPolicy: the policy directory or one of its files is unusable.
	ErrPolicy = errors.New("bootpolicy: invalid boot policy")
)

// Limits on policy files; they are the operator's, but a policy directory
// is read at every start and must not take the server down.
const (
	maxPolicyFileSize = 1 << 20
	maxCertFileSize   = 64 << 10
	maxPolicyFiles    = 256
)

var classPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Policy is one machine class's boot policy, read from one TOML file of
// the policy directory (docs/boot-policy.md).
type Policy struct {
	// Class is the machine class the policy is for (worker,
	// control-plane, install…).
	Class       string
	Description string
	// File is the file the policy was read from.
	File string
	// SHA256 identifies this version of the policy: "sha256:" and the hex
	// SHA-256 of the file and of its authorities' certificates. Every
	// verdict names it.
	SHA256 string
	// SecureBoot requires Secure Boot on.
	SecureBoot bool
	// Allowed are the authorities that may verify a boot application.
	Allowed []Authority
	// IntakeRequired and RenewRequired name the authorities (of Allowed)
	// that must have verified a boot application at intake and at renewal
	// or a boot check.
	IntakeRequired []string
	RenewRequired  []string
	// BootApplications are the pins: when there are any, every
	// measurement of code in PCR 4 must match one, and there must be one.
	BootApplications []Pin
}

// Authority is a signing authority a policy names: the SHA-256 of its
// certificate's DER.
type Authority struct {
	Name   string
	SHA256 [sha256.Size]byte
	// Subject is the certificate's subject when the policy gave the
	// certificate file, empty when it gave the digest alone.
	Subject string
}

// Pin is an exact boot application: the SHA-256 digest PCR 4 is extended
// with when it is loaded (its Authenticode hash).
type Pin struct {
	Name   string
	SHA256 [sha256.Size]byte
}

// Policies are the boot policies of every machine class, loaded once at
// start. A class without a file has no policy, and evaluating a node of
// it is an error: nothing is accepted by default.
type Policies struct {
	dir     string
	byClass map[string]*Policy
	now     func() time.Time
}

// Config says where the policies are.
type Config struct {
	// Dir is the policy directory: every *.toml file in it is one class's
	// policy; certificate files the policies name may sit beside them.
	Dir string
	// Now stamps verdicts; time.Now by default.
	Now func() time.Time
}

// Load reads every policy file of cfg.Dir. It fails — and the caller must
// not start without boot policy — when the directory holds no policy file,
// when any file does not parse or names an unknown setting, or when two
// files are for the same class; the error names every problem found, by
// file and setting. Errors wrap [ErrPolicy].
func Load(cfg Config) (*Policies, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: no policy directory given", ErrPolicy)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	entries, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: read the policy directory: %w", ErrPolicy, err)
	}
	ps := &Policies{dir: cfg.Dir, byClass: map[string]*Policy{}, now: cfg.Now}
	var errs []error
	files := 0
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".toml") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if files++; files > maxPolicyFiles {
			errs = append(errs, fmt.Errorf("more than %d policy files", maxPolicyFiles))
			break
		}
		path := filepath.Join(cfg.Dir, e.Name())
		p, err := loadPolicy(cfg.Dir, path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if other, dup := ps.byClass[p.Class]; dup {
			errs = append(errs, fmt.Errorf("%s: class %q is already the class of %s", path, p.Class, other.File))
			continue
		}
		ps.byClass[p.Class] = p
	}
	if files == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("no policy file (*.toml) in %s: write one per machine class (docs/boot-policy.md)", cfg.Dir))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, errors.Join(errs...))
	}
	return ps, nil
}

// Dir is the directory the policies were read from.
func (ps *Policies) Dir() string { return ps.dir }

// Classes are the classes that have a policy, sorted.
func (ps *Policies) Classes() []string {
	out := make([]string, 0, len(ps.byClass))
	for c := range ps.byClass {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Policy returns the policy of class, or an error wrapping
// [ErrUnknownClass].
func (ps *Policies) Policy(class string) (*Policy, error) {
	p, ok := ps.byClass[class]
	if !ok {
		return nil, fmt.Errorf("%w: %q (the policy directory %s has %s)", ErrUnknownClass, capString(class, 64), ps.dir, strings.Join(ps.Classes(), ", "))
	}
	return p, nil
}

// policyFile is a policy file's TOML.
type policyFile struct {
	Class                     string           `toml:"class"`
	Description               string           `toml:"description"`
	SecureBoot                *bool            `toml:"secure_boot"`
	AllowedAuthorities        []authorityEntry `toml:"allowed_authorities"`
	IntakeRequiredAuthorities []string         `toml:"intake_required_authorities"`
	RenewRequiredAuthorities  []string         `toml:"renew_required_authorities"`
	BootApplications          []pinEntry       `toml:"boot_applications"`
}

type authorityEntry struct {
	Name   string `toml:"name"`
	File   string `toml:"file"`
	SHA256 string `toml:"sha256"`
}

type pinEntry struct {
	Name   string `toml:"name"`
	SHA256 string `toml:"sha256"`
}

// loadPolicy reads and checks one policy file; the error names the file
// and every setting that is wrong.
func loadPolicy(dir, path string) (*Policy, error) {
	raw, err := readBounded(path, maxPolicyFileSize)
	if err != nil {
		return nil, err
	}
	var f policyFile
	md, err := toml.Decode(string(raw), &f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		bad("unknown setting %s", strings.Join(keys, ", "))
	}
	p := &Policy{Class: f.Class, Description: f.Description, File: path}
	if !classPattern.MatchString(f.Class) {
		bad("class: %q is not a class name (lower-case letters, digits, '.', '_' and '-', at most 63)", capString(f.Class, 64))
	}
	if f.SecureBoot == nil {
		bad("secure_boot: must be set, to true or false")
	} else {
		p.SecureBoot = *f.SecureBoot
	}

	policyHash := sha256.New()
	policyHash.Write(raw)
	names := map[string]bool{}
	digests := map[[sha256.Size]byte]string{}
	for i, a := range f.AllowedAuthorities {
		where := fmt.Sprintf("allowed_authorities[%d]", i)
		if a.Name == "" {
			bad("%s: name is required", where)
		} else if names[a.Name] {
			bad("%s: the name %q is used twice", where, a.Name)
		}
		names[a.Name] = true
		auth := Authority{Name: a.Name}
		switch {
		case (a.File == "") == (a.SHA256 == ""):
			bad("%s (%s): give exactly one of file (a PEM or DER certificate) and sha256 (of its DER)", where, a.Name)
			continue
		case a.File != "":
			file := a.File
			if !filepath.IsAbs(file) {
				file = filepath.Join(dir, file)
			}
			cert, err := readCertificate(file)
			if err != nil {
				bad("%s (%s): %w", where, a.Name, err)
				continue
			}
			auth.SHA256 = sha256.Sum256(cert.Raw)
			auth.Subject = cert.Subject.String()
		default:
			d, err := parseDigest(a.SHA256)
			if err != nil {
				bad("%s (%s): sha256: %w", where, a.Name, err)
				continue
			}
			auth.SHA256 = d
		}
		if other, dup := digests[auth.SHA256]; dup {
			bad("%s (%s): the same certificate as %s", where, a.Name, other)
			continue
		}
		digests[auth.SHA256] = a.Name
		policyHash.Write(auth.SHA256[:])
		p.Allowed = append(p.Allowed, auth)
	}
	if p.SecureBoot && len(f.AllowedAuthorities) == 0 {
		bad("allowed_authorities: Secure Boot is required, so at least one authority must be allowed")
	}
	for _, req := range []struct {
		key   string
		names []string
		out   *[]string
	}{
		{"intake_required_authorities", f.IntakeRequiredAuthorities, &p.IntakeRequired},
		{"renew_required_authorities", f.RenewRequiredAuthorities, &p.RenewRequired},
	} {
		for _, n := range req.names {
			if !names[n] {
				bad("%s: %q is not the name of one of allowed_authorities", req.key, n)
				continue
			}
			if slices.Contains(*req.out, n) {
				bad("%s: %q is listed twice", req.key, n)
				continue
			}
			*req.out = append(*req.out, n)
		}
	}
	pins := map[[sha256.Size]byte]string{}
	for i, b := range f.BootApplications {
		where := fmt.Sprintf("boot_applications[%d]", i)
		if b.Name == "" {
			bad("%s: name is required", where)
		}
		d, err := parseDigest(b.SHA256)
		if err != nil {
			bad("%s (%s): sha256: %w", where, b.Name, err)
			continue
		}
		if other, dup := pins[d]; dup {
			bad("%s (%s): the same digest as %s", where, b.Name, other)
			continue
		}
		pins[d] = b.Name
		p.BootApplications = append(p.BootApplications, Pin{Name: b.Name, SHA256: d})
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", path, errors.Join(errs...))
	}
	p.SHA256 = "sha256:" + hex.EncodeToString(policyHash.Sum(nil))
	return p, nil
}

// parseDigest reads a SHA-256 digest written as 64 hex digits, with an
// optional "sha256:" prefix.
func parseDigest(s string) ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	h := strings.TrimPrefix(strings.TrimSpace(s), "sha256:")
	if len(h) != 2*sha256.Size {
		return d, fmt.Errorf("%q is not 64 hex digits", capString(s, 80))
	}
	if _, err := hex.Decode(d[:], []byte(h)); err != nil {
		return d, fmt.Errorf("%q is not 64 hex digits", capString(s, 80))
	}
	return d, nil
}

// readCertificate reads one certificate, PEM (the first CERTIFICATE
// block) or DER.
func readCertificate(path string) (*x509.Certificate, error) {
	raw, err := readBounded(path, maxCertFileSize)
	if err != nil {
		return nil, err
	}
	der := raw
	if bytes.Contains(raw, []byte("-----BEGIN")) {
		der = nil
		for rest := raw; ; {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type == "CERTIFICATE" {
				der = b.Bytes
				break
			}
		}
		if der == nil {
			return nil, fmt.Errorf("%s holds no PEM CERTIFICATE block", path)
		}
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse the certificate in %s: %w", path, err)
	}
	return c, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than the %d bytes such a file may have", path, limit)
	}
	return b, nil
}
