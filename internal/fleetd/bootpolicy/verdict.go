package bootpolicy

import (
	"encoding/hex"
	"strings"
	"time"
	"unicode"

	"github.com/nodetrust/nodetrust/attest"
)

// Bounds on what a verdict repeats from the node's log, so that a hostile
// log makes a verdict of bounded size whatever it holds.
const (
	maxListed           = 8   // items named in one rule's detail
	maxSubjectLen       = 160 // characters of a certificate subject
	maxDetailLen        = 2048
	maxBootApplications = 32 // boot applications in a verdict's summary
	maxCertificates     = 16 // certificates listed per signature database
)

// Verdict is the outcome of evaluating one boot against its class's
// policy. Its JSON is a line of verdicts.jsonl and the output of
// `fleetd policy check --json` (docs/boot-policy.md).
type Verdict struct {
	Time time.Time `json:"time"`
	// NodeID is the node the evidence came from; the caller sets it
	// (empty for an offline check).
	NodeID string `json:"node_id,omitempty"`
	Class  string `json:"class"`
	Stage  Stage  `json:"stage"`
	// Policy is the policy's SHA256: which version of it decided.
	Policy string `json:"policy_sha256"`
	// Result is "pass" or "fail".
	Result string `json:"result"`
	// QuoteVerified is true when Evaluate verified the quote itself.
	QuoteVerified bool `json:"quote_verified"`
	// Matched says which state of the policy a passing boot matched:
	// "current", "next" or "both" (inside a next state's window); empty
	// when the verdict fails.
	Matched string `json:"matched,omitempty"`
	// Failed names every rule that failed, in Rules' order.
	Failed []string `json:"failed,omitempty"`
	// NextFailed names the rules of the next state that failed, when it
	// was evaluated (inside its window) and failed.
	NextFailed []string `json:"next_failed,omitempty"`
	// Rules are every rule of the policy with its outcome.
	Rules []RuleResult `json:"rules"`
	// Notes say what the policy leaves open, such as an empty pin list.
	Notes []string `json:"notes,omitempty"`
	// Boot is what the log says of the boot; nil when it did not replay.
	Boot *Boot `json:"boot,omitempty"`
}

// RuleResult is one rule's outcome.
type RuleResult struct {
	Rule   string `json:"rule"`
	Pass   bool   `json:"pass"`
	Detail string `json:"detail"`
}

// Boot summarises an [attest.BootState] for a verdict: digests, subjects
// and the names the policy gives them.
type Boot struct {
	// SecureBoot is "on", "off" or "unknown" (the log does not measure
	// PCR 7).
	SecureBoot        string         `json:"secure_boot"`
	PK                Database       `json:"pk"`
	KEK               Database       `json:"kek"`
	DB                Database       `json:"db"`
	DBX               Database       `json:"dbx"`
	DriverAuthorities []AuthorityRef `json:"driver_authorities,omitempty"`
	Authorities       []AuthorityRef `json:"authorities,omitempty"`
	BootApplications  []Application  `json:"boot_applications,omitempty"`
	// BootApplicationsOmitted counts the boot applications past the first
	// 32, which the summary leaves out.
	BootApplicationsOmitted int `json:"boot_applications_omitted,omitempty"`
	// Kernel is the SHA-256 of the last boot application: the kernel or
	// unified kernel image.
	Kernel string `json:"kernel_sha256,omitempty"`
}

// Database is a Secure Boot signature database.
type Database struct {
	Certificates []AuthorityRef `json:"certificates,omitempty"`
	// Omitted counts certificates past the first 16.
	Omitted int `json:"certificates_omitted,omitempty"`
	Hashes  int `json:"hashes"`
}

// AuthorityRef names a certificate.
type AuthorityRef struct {
	SHA256  string `json:"sha256"`
	Subject string `json:"subject"`
	// Name is the policy's name for it, when the policy allows it.
	Name string `json:"name,omitempty"`
}

// Application is a boot application measured into PCR 4.
type Application struct {
	SHA256 string `json:"sha256"`
	Type   string `json:"type"`
	// Path is the file path the log gives: a hint the digest does not
	// cover.
	Path string `json:"path,omitempty"`
	// VerifiedBy are the SHA-256s of the authorities logged just before
	// it.
	VerifiedBy []string `json:"verified_by,omitempty"`
	// Pin is the policy's name for it, when a pin matches.
	Pin string `json:"pin,omitempty"`
}

// Pass reports whether every rule passed.
func (v *Verdict) Pass() bool { return v.Result == "pass" }

func (v *Verdict) add(rule string, pass bool, detail string) {
	v.Rules = append(v.Rules, RuleResult{Rule: rule, Pass: pass, Detail: capString(detail, maxDetailLen)})
}

func (v *Verdict) note(s string) { v.Notes = append(v.Notes, s) }

// finish sets Result and Failed from Rules.
func (v *Verdict) finish() {
	v.Failed = nil
	for _, r := range v.Rules {
		if !r.Pass {
			v.Failed = append(v.Failed, r.Rule)
		}
	}
	v.Result = "pass"
	if len(v.Failed) > 0 {
		v.Result = "fail"
	}
}

func (p *Policy) summarise(bs *attest.BootState) *Boot {
	b := &Boot{
		SecureBoot: secureBootWord(bs),
		PK:         p.database(bs.PK), KEK: p.database(bs.KEK), DB: p.database(bs.DB), DBX: p.database(bs.DBX),
	}
	for _, a := range bs.DriverAuthorities {
		b.DriverAuthorities = append(b.DriverAuthorities, p.ref(a))
	}
	for _, a := range bs.Authorities {
		b.Authorities = append(b.Authorities, p.ref(a))
	}
	// Both lists hold each authority once, and only those whose
	// certificate the log carried and go-attestation parsed; cap them
	// anyway.
	b.DriverAuthorities = capSlice(b.DriverAuthorities, maxCertificates)
	b.Authorities = capSlice(b.Authorities, maxCertificates)
	for i, a := range bs.BootApplications {
		if i == maxBootApplications {
			b.BootApplicationsOmitted = len(bs.BootApplications) - i
			break
		}
		app := Application{SHA256: hex.EncodeToString(a.Digest[:]), Type: capString(a.Type, 48), Path: a.Path, Pin: p.pinName(a.Digest)}
		for _, au := range capSlice(a.Authorities, maxListed) {
			app.VerifiedBy = append(app.VerifiedBy, hex.EncodeToString(au.SHA256[:]))
		}
		b.BootApplications = append(b.BootApplications, app)
	}
	if k := bs.Kernel(); k != nil {
		b.Kernel = hex.EncodeToString(k.Digest[:])
	}
	return b
}

func (p *Policy) database(db attest.SignatureDatabase) Database {
	out := Database{Hashes: db.Hashes}
	for i, c := range db.Certificates {
		if i == maxCertificates {
			out.Omitted = len(db.Certificates) - i
			break
		}
		out.Certificates = append(out.Certificates, p.ref(c))
	}
	return out
}

func (p *Policy) ref(a attest.Authority) AuthorityRef {
	return AuthorityRef{
		SHA256:  hex.EncodeToString(a.SHA256[:]),
		Subject: capString(a.Certificate.Subject.String(), maxSubjectLen),
		Name:    p.allowedName(a.SHA256),
	}
}

func capSlice[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// capString caps s at max characters and replaces control characters,
// for values that come from the node or the operator's input.
func capString(s string, max int) string {
	var b strings.Builder
	n := 0
	for _, r := range s {
		if n == max {
			b.WriteString("…")
			break
		}
		if unicode.IsControl(r) {
			r = '?'
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}
