package bootpolicy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/attest"
)

// Errors of [Policies.Evaluate] besides [ErrUnknownClass]. Neither is a
// verdict: the evidence proves nothing about the machine, so a caller
// must change no state for it (it counts it and refuses the request).
var (
	// ErrUnproven: the quote does not verify, so the PCR values are not
	// the TPM's.
	ErrUnproven = errors.New("bootpolicy: boot evidence not proven by the TPM")
	// ErrEvidence: the evidence is not complete (no PCR values 0–7, an
	// unknown stage).
	ErrEvidence = errors.New("bootpolicy: incomplete boot evidence")
)

// Stage is when a boot is evaluated; it chooses which required
// authorities apply.
type Stage string

const (
	// Intake is a machine's first attestation (a tpm join): the
	// policy's intake_required_authorities apply.
	Intake Stage = "intake"
	// Renewal is the renewal of a certificate that names an AK:
	// renew_required_authorities apply.
	Renewal Stage = "renewal"
	// BootCheck is the periodic boot evidence of a running node:
	// renew_required_authorities apply, as at renewal.
	BootCheck Stage = "boot-check"
)

// Rule names, as verdicts, logs and metrics give them.
const (
	RuleEventLog                  = "event_log"
	RuleSecureBoot                = "secure_boot"
	RuleAllowedAuthorities        = "allowed_authorities"
	RuleIntakeRequiredAuthorities = "intake_required_authorities"
	RuleRenewRequiredAuthorities  = "renew_required_authorities"
	RuleBootApplications          = "boot_applications"
	RulePCRValues                 = "pcr_values"
)

// Which state of a policy a passing verdict matched ([Verdict.Matched]).
const (
	MatchedCurrent = "current"
	MatchedNext    = "next"
	// MatchedBoth: inside the next state's window, the boot matches the
	// current state and the next one.
	MatchedBoth = "both"
)

// Evidence is one boot's evidence: PCR values 0–7 of the SHA-256 bank and
// the measurement log that should replay to them.
type Evidence struct {
	// Quote, when not nil, is the AK's quote over the PCR values: Evaluate
	// verifies it first. When nil the caller vouches for PCRs (it verified
	// the quote itself, or an operator captured them for an offline check),
	// and the verdict says the quote was not verified here.
	Quote *Quote
	// PCRs are the SHA-256 values of PCRs 0–7.
	PCRs map[int][]byte
	// EventLog is the TCG measurement log (binary_bios_measurements).
	EventLog []byte
}

// Quote is a TPM2_Quote, as attest.VerifyQuote takes it. The caller must
// have proven the AK (credential activation at a join, or the AK its
// certificate names) and made Nonce fresh.
type Quote struct {
	AKPublic, Attest, Signature, Nonce []byte
}

// Evaluate evaluates ev against the policy of class at stage. It returns
// an error wrapping [ErrUnknownClass] when no policy names the class,
// [ErrUnproven] when the quote does not verify, and [ErrEvidence] when the
// evidence is incomplete; every other outcome is a verdict, passing or
// failing, that names every rule that failed. A log that does not replay
// is a failed verdict (rule event_log), not an error: it is TPM-proven
// evidence that the node's account of its boot is false.
//
// A policy with a next state ([Policy.Next]) evaluates the boot against
// both while the next state's window is open: the verdict passes when
// either state passes, and [Verdict.Matched] says which ("current",
// "next" or "both"); a failing verdict lists the current state's failed
// rules and the next state's in NextFailed. Before the window opens and
// after it ends, only the current state is evaluated, and a note says so.
func (ps *Policies) Evaluate(class string, stage Stage, ev Evidence) (*Verdict, error) {
	p, err := ps.Policy(class)
	if err != nil {
		return nil, err
	}
	return p.Evaluate(stage, ev, ps.now())
}

// Evaluate evaluates ev against p at stage and time now, as
// [Policies.Evaluate] does.
func (p *Policy) Evaluate(stage Stage, ev Evidence, now time.Time) (*Verdict, error) {
	cur, err := p.evaluate(stage, ev, now)
	if err != nil {
		return nil, err
	}
	if cur.Pass() {
		cur.Matched = MatchedCurrent
	}
	if p.Next == nil {
		return cur, nil
	}
	w := p.NextWindow
	switch {
	case now.Before(w.NotBefore):
		cur.note("the next state is not evaluated before its window opens at " + w.NotBefore.UTC().Format(time.RFC3339))
		return cur, nil
	case !w.Contains(now):
		cur.note("the next state's window ended at " + w.NotAfter.UTC().Format(time.RFC3339) + " unpromoted: only the current state passes (fleetd policy promote makes next current)")
		return cur, nil
	}
	next, err := p.Next.evaluate(stage, ev, now)
	if err != nil {
		return nil, err
	}
	until := " (next state window until " + w.NotAfter.UTC().Format(time.RFC3339) + ")"
	switch {
	case cur.Pass() && next.Pass():
		cur.Matched = MatchedBoth
		cur.note("the boot matches the current and the next state" + until)
		return cur, nil
	case cur.Pass():
		cur.NextFailed = next.Failed
		cur.note("the boot matches the current state, not the next one" + until + ": " + strings.Join(next.Failed, ", "))
		return cur, nil
	case next.Pass():
		next.Matched = MatchedNext
		next.Notes = append(next.Notes, "the boot matches the next state, not the current one"+until+": "+strings.Join(cur.Failed, ", "))
		return next, nil
	}
	cur.NextFailed = next.Failed
	cur.note("the next state failed too" + until + ": " + strings.Join(next.Failed, ", "))
	return cur, nil
}

func (p *Policy) requiredAt(stage Stage) (string, []string, error) {
	switch stage {
	case Intake:
		return RuleIntakeRequiredAuthorities, p.IntakeRequired, nil
	case Renewal, BootCheck:
		return RuleRenewRequiredAuthorities, p.RenewRequired, nil
	}
	return "", nil, fmt.Errorf("%w: unknown stage %q", ErrEvidence, capString(string(stage), 32))
}

func (p *Policy) evaluate(stage Stage, ev Evidence, now time.Time) (*Verdict, error) {
	requiredRule, required, err := p.requiredAt(stage)
	if err != nil {
		return nil, err
	}
	if ev.Quote != nil {
		q := ev.Quote
		if err := attest.VerifyQuote(q.AKPublic, q.Attest, q.Signature, q.Nonce, ev.PCRs); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnproven, err)
		}
	} else if err := checkPCRs(ev.PCRs); err != nil {
		return nil, err
	}

	v := &Verdict{
		Time: now.UTC(), Class: p.Class, Stage: stage, Policy: p.SHA256,
		QuoteVerified: ev.Quote != nil,
	}
	if ev.Quote == nil {
		v.note("the quote was not verified here: the PCR values are taken as given")
	}
	log, err := attest.ReplayEventLog(ev.EventLog, ev.PCRs)
	if err != nil {
		v.add(RuleEventLog, false, strings.TrimPrefix(err.Error(), attest.ErrEventLog.Error()+": "))
		for _, r := range []string{RuleSecureBoot, RuleAllowedAuthorities, requiredRule, RuleBootApplications} {
			v.add(r, false, "not evaluated: the event log was refused")
		}
		p.checkPCRValues(v, ev.PCRs)
		v.finish()
		return v, nil
	}
	bs := log.BootState()
	v.add(RuleEventLog, true, fmt.Sprintf("%d events replay to the quoted PCRs; quoted PCRs without events hold their initial values", len(log.Events)))
	v.Boot = p.summarise(bs)
	p.checkSecureBoot(v, bs)
	p.checkAllowed(v, bs)
	p.checkRequired(v, bs, requiredRule, required)
	p.checkBootApplications(v, bs)
	p.checkPCRValues(v, ev.PCRs)
	v.finish()
	return v, nil
}

// checkPCRValues checks the pinned PCR values; a policy that pins none has
// no pcr_values rule.
func (p *Policy) checkPCRValues(v *Verdict, pcrs map[int][]byte) {
	if len(p.PCRValues) == 0 {
		return
	}
	var differ []string
	for _, want := range p.PCRValues {
		if got := pcrs[want.Index]; !bytes.Equal(got, want.SHA256[:]) {
			differ = append(differ, fmt.Sprintf("PCR %d is %s, the policy pins %s", want.Index, shortHex(got), shortHex(want.SHA256[:])))
		}
	}
	if len(differ) > 0 {
		v.add(RulePCRValues, false, listOf(differ))
		return
	}
	idx := make([]string, len(p.PCRValues))
	for i, w := range p.PCRValues {
		idx[i] = fmt.Sprint(w.Index)
	}
	v.add(RulePCRValues, true, "PCRs "+strings.Join(idx, ", ")+" hold the pinned values")
}

func shortHex(b []byte) string {
	if len(b) == 0 {
		return "(no value)"
	}
	h := hex.EncodeToString(b)
	if len(h) > 16 {
		h = h[:16] + "…"
	}
	return h
}

// checkPCRs checks PCR values an offline check or a caller that verified
// the quote itself gives: exactly PCRs 0–7, 32 bytes each.
func checkPCRs(pcrs map[int][]byte) error {
	for _, i := range attest.QuotePCRs {
		v, ok := pcrs[i]
		if !ok {
			return fmt.Errorf("%w: no value for PCR %d (PCRs 0-7 are needed)", ErrEvidence, i)
		}
		if len(v) != sha256.Size {
			return fmt.Errorf("%w: PCR %d value of %d bytes, want %d (SHA-256)", ErrEvidence, i, len(v), sha256.Size)
		}
	}
	if len(pcrs) != len(attest.QuotePCRs) {
		return fmt.Errorf("%w: %d PCR values, want PCRs 0-7 alone", ErrEvidence, len(pcrs))
	}
	return nil
}

func (p *Policy) checkSecureBoot(v *Verdict, bs *attest.BootState) {
	state := secureBootWord(bs)
	switch {
	case !p.SecureBoot:
		v.add(RuleSecureBoot, true, "not required (Secure Boot is "+state+")")
	case !bs.SecureBootKnown:
		v.add(RuleSecureBoot, false, "required, but the log does not measure PCR 7: the Secure Boot state is unknown")
	case !bs.SecureBoot:
		v.add(RuleSecureBoot, false, "required, but Secure Boot is off")
	default:
		v.add(RuleSecureBoot, true, "on")
	}
}

func (p *Policy) checkAllowed(v *Verdict, bs *attest.BootState) {
	if len(bs.Authorities) == 0 {
		v.add(RuleAllowedAuthorities, true, "no authority verified a boot application")
		return
	}
	var ok, unknown []string
	for _, a := range bs.Authorities {
		if name := p.allowedName(a.SHA256); name != "" {
			ok = append(ok, name)
		} else {
			unknown = append(unknown, describeAuthority(a))
		}
	}
	if len(unknown) > 0 {
		v.add(RuleAllowedAuthorities, false, "not allowed: "+listOf(unknown))
		return
	}
	v.add(RuleAllowedAuthorities, true, "all allowed: "+listOf(ok))
}

func (p *Policy) checkRequired(v *Verdict, bs *attest.BootState, rule string, required []string) {
	if len(required) == 0 {
		v.add(rule, true, "none required")
		v.note(rule + " is empty: no particular authority is required; allowed_authorities still apply")
		return
	}
	var missing []string
	for _, name := range required {
		d := p.authority(name).SHA256
		if !slices.ContainsFunc(bs.Authorities, func(a attest.Authority) bool { return a.SHA256 == d }) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		v.add(rule, false, "verified no boot application: "+listOf(missing))
		return
	}
	v.add(rule, true, "present: "+listOf(required))
}

func (p *Policy) checkBootApplications(v *Verdict, bs *attest.BootState) {
	if len(p.BootApplications) == 0 {
		v.add(RuleBootApplications, true, "no pins")
		v.note("boot_applications is empty: no exact image is pinned, so any image the allowed authorities signed passes")
		return
	}
	switch {
	case !bs.PCR4Known:
		v.add(RuleBootApplications, false, "PCR 4 was not replayed")
		return
	case len(bs.BootApplications) == 0:
		v.add(RuleBootApplications, false, "PCR 4's log has no boot application, and the class pins them (a log stripped of PCR 4 fails)")
		return
	}
	var unpinned []string
	for _, a := range bs.BootApplications {
		if p.pinName(a.Digest) == "" {
			unpinned = append(unpinned, describeApplication(a))
		}
	}
	if len(unpinned) > 0 {
		v.add(RuleBootApplications, false, "not pinned: "+listOf(unpinned))
		return
	}
	v.add(RuleBootApplications, true, fmt.Sprintf("all %d pinned", len(bs.BootApplications)))
}

func (p *Policy) allowedName(d [sha256.Size]byte) string {
	for _, a := range p.Allowed {
		if a.SHA256 == d {
			return a.Name
		}
	}
	return ""
}

func (p *Policy) authority(name string) Authority {
	for _, a := range p.Allowed {
		if a.Name == name {
			return a
		}
	}
	return Authority{}
}

func (p *Policy) pinName(d [sha256.Size]byte) string {
	for _, b := range p.BootApplications {
		if b.SHA256 == d {
			return b.Name
		}
	}
	return ""
}

func secureBootWord(bs *attest.BootState) string {
	switch {
	case !bs.SecureBootKnown:
		return "unknown"
	case bs.SecureBoot:
		return "on"
	}
	return "off"
}

func describeAuthority(a attest.Authority) string {
	return fmt.Sprintf("%s (sha256:%s)", capString(a.Certificate.Subject.String(), maxSubjectLen), hex.EncodeToString(a.SHA256[:]))
}

func describeApplication(a attest.BootApplication) string {
	s := "sha256:" + hex.EncodeToString(a.Digest[:])
	if a.Path != "" {
		s += " (" + a.Path + ")"
	}
	return s
}

// listOf joins items, at most maxListed of them, so that a verdict about
// a hostile log stays small.
func listOf(items []string) string {
	if len(items) > maxListed {
		return strings.Join(items[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxListed)
	}
	return strings.Join(items, ", ")
}
