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
	// PCRValues are exact SHA-256 values PCRs must hold (rule
	// pcr_values); none pins no PCR.
	PCRValues []PCRValue

	// Mode is ModeEnforce (the default) or ModeAudit: in audit, verdicts
	// are recorded and a failure alerts, nothing is enforced.
	Mode string
	// QuarantineAfter is how many failed verdicts in a row quarantine a
	// node in enforce mode ([response] quarantine_after, default 1).
	QuarantineAfter int
	// Critical are rule names ([response] critical) whose failure
	// quarantines at once, whatever QuarantineAfter says.
	Critical []string

	// Next is the expected state of a pending update ([next] of the file),
	// nil when there is none: within [NextWindow] a boot passes when it
	// matches the current state or Next, and the verdict says which.
	Next *Policy
	// NextWindow is when Next passes besides the current state.
	NextWindow Window
}

// PCRValue pins a PCR of the SHA-256 bank to one value.
type PCRValue struct {
	Index  int
	SHA256 [sha256.Size]byte
}

// Window is a period [NotBefore, NotAfter).
type Window struct {
	NotBefore, NotAfter time.Time
}

// Contains reports whether t is within the window.
func (w Window) Contains(t time.Time) bool { return !t.Before(w.NotBefore) && t.Before(w.NotAfter) }

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
	Class       string `toml:"class"`
	Description string `toml:"description"`
	Mode        string `toml:"mode"`
	stateFile
	Response *responseFile `toml:"response"`
	Next     *nextFile     `toml:"next"`
}

// responseFile is [response]: how an enforced policy answers failures.
type responseFile struct {
	QuarantineAfter *int     `toml:"quarantine_after"`
	Critical        []string `toml:"critical"`
}

// Modes of a policy.
const (
	// ModeEnforce acts on a failed verdict (the default).
	ModeEnforce = "enforce"
	// ModeAudit records verdicts and alerts on failures, and enforces
	// nothing.
	ModeAudit = "audit"
)

// MaxQuarantineAfter bounds [response] quarantine_after: the count is
// read from the stored verdict history, which keeps fewer.
const MaxQuarantineAfter = 20

// Rules are the names of every rule a verdict may have, in the order a
// verdict lists them.
var Rules = []string{RuleEventLog, RuleSecureBoot, RuleAllowedAuthorities, RuleIntakeRequiredAuthorities, RuleRenewRequiredAuthorities, RuleBootApplications, RulePCRValues}

// Enforced reports whether a failed verdict of p is acted on.
func (p *Policy) Enforced() bool { return p.Mode != ModeAudit }

// IsCritical reports whether rule is one of p's critical rules.
func (p *Policy) IsCritical(rule string) bool { return slices.Contains(p.Critical, rule) }

// stateFile are the rules of a state: the current one at the top of the
// file, the next one under [next].
type stateFile struct {
	SecureBoot                *bool            `toml:"secure_boot"`
	AllowedAuthorities        []authorityEntry `toml:"allowed_authorities"`
	IntakeRequiredAuthorities []string         `toml:"intake_required_authorities"`
	RenewRequiredAuthorities  []string         `toml:"renew_required_authorities"`
	BootApplications          []pinEntry       `toml:"boot_applications"`
	PCRValues                 []pcrEntry       `toml:"pcr_values"`
}

// nextFile is [next]: a state whose keys, when given, replace the
// current state's, and the window in which it passes.
type nextFile struct {
	Description string    `toml:"description"`
	NotBefore   time.Time `toml:"not_before"`
	NotAfter    time.Time `toml:"not_after"`
	stateFile
}

// stateKeys are the keys of a state, in the order a policy file gives
// them.
var stateKeys = []string{"secure_boot", "intake_required_authorities", "renew_required_authorities", "allowed_authorities", "boot_applications", "pcr_values"}

type authorityEntry struct {
	Name   string `toml:"name"`
	File   string `toml:"file"`
	SHA256 string `toml:"sha256"`
	// comment is written above the entry by [formatPolicy].
	comment string
}

type pinEntry struct {
	Name    string `toml:"name"`
	SHA256  string `toml:"sha256"`
	comment string
}

type pcrEntry struct {
	Index   *int   `toml:"index"`
	SHA256  string `toml:"sha256"`
	comment string
}

// maxNextWindow bounds a [next] window: a rollout that needs longer is
// better promoted and given a new next state.
const maxNextWindow = 366 * 24 * time.Hour

// loadPolicy reads and checks one policy file; the error names the file
// and every setting that is wrong.
func loadPolicy(dir, path string) (*Policy, error) {
	raw, err := readBounded(path, maxPolicyFileSize)
	if err != nil {
		return nil, err
	}
	return parsePolicy(dir, path, raw)
}

// decodePolicy decodes a policy file's TOML and lists its unknown keys.
func decodePolicy(raw []byte) (*policyFile, toml.MetaData, error) {
	var f policyFile
	md, err := toml.Decode(string(raw), &f)
	return &f, md, err
}

// parsePolicy checks the policy file raw, read from path; certificate
// files it names resolve against dir.
func parsePolicy(dir, path string, raw []byte) (*Policy, error) {
	f, md, err := decodePolicy(raw)
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
	switch f.Mode {
	case "", ModeEnforce:
		p.Mode = ModeEnforce
	case ModeAudit:
		p.Mode = ModeAudit
	default:
		bad("mode: %q is neither %q nor %q", capString(f.Mode, 64), ModeEnforce, ModeAudit)
	}
	p.QuarantineAfter = 1
	if r := f.Response; r != nil {
		if q := r.QuarantineAfter; q != nil {
			if *q < 1 || *q > MaxQuarantineAfter {
				bad("response.quarantine_after: %d is not between 1 and %d (failed verdicts in a row that quarantine)", *q, MaxQuarantineAfter)
			} else {
				p.QuarantineAfter = *q
			}
		}
		for _, c := range r.Critical {
			switch {
			case !slices.Contains(Rules, c):
				bad("response.critical: %q is not a rule (%s)", capString(c, 64), strings.Join(Rules, ", "))
			case slices.Contains(p.Critical, c):
				bad("response.critical: %q is listed twice", c)
			default:
				p.Critical = append(p.Critical, c)
			}
		}
	}
	policyHash := sha256.New()
	policyHash.Write(raw)
	if f.SecureBoot == nil {
		bad("secure_boot: must be set, to true or false")
	}
	p.readState(dir, "", &f.stateFile, policyHash, bad)

	if f.Next != nil {
		n := f.Next
		w := Window{NotBefore: n.NotBefore, NotAfter: n.NotAfter}
		switch {
		case !md.IsDefined("next", "not_before") || !md.IsDefined("next", "not_after"):
			bad("next: not_before and not_after are required (TOML date-times such as 2026-12-01T00:00:00Z): the window in which the next state passes")
		case !w.NotBefore.Before(w.NotAfter):
			bad("next: not_before %s is not before not_after %s", w.NotBefore.Format(time.RFC3339), w.NotAfter.Format(time.RFC3339))
		case w.NotAfter.Sub(w.NotBefore) > maxNextWindow:
			bad("next: a window of %s, longer than %d days: promote and give a new next state instead", w.NotAfter.Sub(w.NotBefore), int(maxNextWindow.Hours()/24))
		}
		// The next state starts as the current one; each key [next]
		// gives replaces the current state's.
		merged := f.stateFile
		given := 0
		for _, k := range stateKeys {
			if md.IsDefined("next", k) {
				given++
				setStateKey(&merged, &n.stateFile, k)
			}
		}
		if given == 0 {
			bad("next: gives no rule (%s): a next state equal to the current one is a mistake", strings.Join(stateKeys, ", "))
		}
		next := &Policy{Class: f.Class, Description: n.Description, File: path, Mode: p.Mode, QuarantineAfter: p.QuarantineAfter, Critical: p.Critical}
		next.readState(dir, "next.", &merged, policyHash, bad)
		p.Next, p.NextWindow = next, w
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", path, errors.Join(errs...))
	}
	p.SHA256 = "sha256:" + hex.EncodeToString(policyHash.Sum(nil))
	if p.Next != nil {
		p.Next.SHA256 = p.SHA256
	}
	return p, nil
}

// setStateKey copies key of from into to.
func setStateKey(to, from *stateFile, key string) {
	switch key {
	case "secure_boot":
		to.SecureBoot = from.SecureBoot
	case "intake_required_authorities":
		to.IntakeRequiredAuthorities = from.IntakeRequiredAuthorities
	case "renew_required_authorities":
		to.RenewRequiredAuthorities = from.RenewRequiredAuthorities
	case "allowed_authorities":
		to.AllowedAuthorities = from.AllowedAuthorities
	case "boot_applications":
		to.BootApplications = from.BootApplications
	case "pcr_values":
		to.PCRValues = from.PCRValues
	}
}

// readState checks the rules of f into p; prefix ("" or "next.") names
// the state in errors.
func (p *Policy) readState(dir, prefix string, f *stateFile, policyHash io.Writer, bad func(string, ...any)) {
	if f.SecureBoot != nil {
		p.SecureBoot = *f.SecureBoot
	}
	names := map[string]bool{}
	digests := map[[sha256.Size]byte]string{}
	for i, a := range f.AllowedAuthorities {
		where := fmt.Sprintf("%sallowed_authorities[%d]", prefix, i)
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
		bad("%sallowed_authorities: Secure Boot is required, so at least one authority must be allowed", prefix)
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
				bad("%s%s: %q is not the name of one of %sallowed_authorities", prefix, req.key, n, prefix)
				continue
			}
			if slices.Contains(*req.out, n) {
				bad("%s%s: %q is listed twice", prefix, req.key, n)
				continue
			}
			*req.out = append(*req.out, n)
		}
	}
	pins := map[[sha256.Size]byte]string{}
	for i, b := range f.BootApplications {
		where := fmt.Sprintf("%sboot_applications[%d]", prefix, i)
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
	seen := map[int]bool{}
	for i, e := range f.PCRValues {
		where := fmt.Sprintf("%spcr_values[%d]", prefix, i)
		if e.Index == nil || *e.Index < 0 || *e.Index > 7 {
			bad("%s: index must be a PCR of the boot quote, 0 to 7", where)
			continue
		}
		if seen[*e.Index] {
			bad("%s: PCR %d is pinned twice", where, *e.Index)
			continue
		}
		seen[*e.Index] = true
		d, err := parseDigest(e.SHA256)
		if err != nil {
			bad("%s (PCR %d): sha256: %w", where, *e.Index, err)
			continue
		}
		p.PCRValues = append(p.PCRValues, PCRValue{Index: *e.Index, SHA256: d})
	}
	slices.SortFunc(p.PCRValues, func(a, b PCRValue) int { return a.Index - b.Index })
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
