package doctor

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/fileperm"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// Status is the outcome of a check. The statuses are ordered from best to
// worst, so the worst of several is the greatest.
type Status int

// The statuses of a check.
const (
	Pass Status = iota // nothing to do
	Warn               // works, or will, but needs attention
	Fail               // does not work
)

// String returns "pass", "warn" or "fail".
func (s Status) String() string {
	switch s {
	case Pass:
		return "pass"
	case Warn:
		return "warn"
	case Fail:
		return "fail"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Result is the outcome of one check.
type Result struct {
	Name    string // the check, such as "identity"
	Status  Status
	Message string // what the check found, one line
	Fix     string // the way back; empty on a pass
}

// The names of the checks, as Result.Name.
const (
	NameIdentity  = "identity"
	NameConfig    = "config"
	NameClock     = "clock"
	NameReachable = "reachability"
)

// Worst returns the worst status of rs; Pass when rs is empty.
func Worst(rs []Result) Status {
	worst := Pass
	for _, r := range rs {
		worst = max(worst, r.Status)
	}
	return worst
}

// ExitCode returns bcd doctor's exit status for the worst status of its
// checks: 0 when every check passed, 3 when the worst is a warning, and 1
// when a check failed (or for a status it does not know). Scripts can thus
// tell a node that works but needs attention (3) from one that does not (1).
func ExitCode(s Status) int {
	switch s {
	case Pass:
		return 0
	case Warn:
		return 3
	}
	return 1
}

// Print writes one line per result: the status, the check's name padded to
// the longest name, and the message, such as
//
//	pass  identity      joined as web-01 until 2026-03-02T12:00:00Z
//	warn  clock         the clock is 12s ahead of the control plane, more than 5s
//	    → synchronise the clock (chrony or systemd-timesyncd), then run bcd doctor again
//
// A result that is not a pass is followed by its Fix on an indented line
// starting with "→". Line breaks in a message or fix are written as spaces.
// Write errors are ignored: Print writes to a terminal or a pipe, where the
// caller has no better place to report them.
func Print(w io.Writer, rs []Result) {
	width := 0
	for _, r := range rs {
		width = max(width, utf8.RuneCountInString(r.Name))
	}
	for _, r := range rs {
		pad := strings.Repeat(" ", width-utf8.RuneCountInString(r.Name))
		fmt.Fprintf(w, "%-4s  %s%s  %s\n", r.Status, r.Name, pad, oneLine(r.Message))
		if r.Status != Pass && r.Fix != "" {
			fmt.Fprintf(w, "    → %s\n", oneLine(r.Fix))
		}
	}
}

// oneLine joins the lines of s with spaces.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// The ways back the checks give.
const (
	fixJoin     = "run bcd join (with the token on standard input)"
	fixClock    = "synchronise the clock (chrony or systemd-timesyncd), then run bcd doctor again"
	fixClockErr = "check the control plane is reachable (see the reachability check)"
	fixPin      = "check serving_ca_spki_pin against the control plane's pki-bundle.json"
)

// The clock offsets CheckClock accepts: up to clockWarn passes, up to
// clockFail warns, beyond it fails.
const (
	clockWarn = 5 * time.Second
	clockFail = 30 * time.Second
)

// IdentityFacts are what the identity check judges.
type IdentityFacts struct {
	DataDir string
	// LoadErr and Leaf are what identity.LoadState returned (Leaf is
	// State.Leaf; nil when LoadErr is not nil).
	LoadErr error
	Leaf    *x509.Certificate
	// Attestor is the node's attestor (identity.json's, else config.toml's
	// [join] attestor): it decides the way back.
	Attestor string
	// Revoked is the journal's entry that ended the current certificate (a
	// revocation, or the control plane refusing it), or nil.
	Revoked *Revocation
	Now     time.Time
}

// Revocation is the journal's record of a certificate's end.
type Revocation struct {
	Time time.Time
	// Refused is true when the control plane refused the certificate as a
	// session opened, rather than revoking a live session.
	Refused bool
	Detail  string
}

// CheckIdentity reports whether the node's identity loads, is not revoked,
// and has a certificate valid at Now. Every failure's fix is the way back
// for the node's attestor (identity.WayBack).
//
//   - LoadErr wrapping identity.ErrNotJoined: Warn "this node has not
//     joined", with the fix to run bcd join.
//   - LoadErr wrapping fs.ErrPermission: Fail with the error, with the fix to
//     run bcd doctor as a user that can read the data directory.
//   - any other LoadErr: Fail with the error. The error's own
//     "; join again: …" ending is left out of the message, since the fix
//     says it.
//   - a revocation in the journal: Fail "the control plane revoked this
//     node's certificate at <time> (<detail>)".
//   - a leaf that expired at Now: Fail "the node certificate expired at
//     <RFC 3339 time>": an expired certificate never renews.
//   - a leaf not yet valid at Now: Warn, with the fix to synchronise the
//     clock: the local clock is behind the control plane's.
//   - otherwise: Pass "joined as <node> until <RFC 3339 time>", the node
//     being the leaf's Subject CommonName.
func CheckIdentity(f IdentityFacts) Result {
	r := Result{Name: NameIdentity}
	rejoin := identity.WayBack(f.Attestor)
	leaf, now := f.Leaf, f.Now
	switch {
	case errors.Is(f.LoadErr, identity.ErrNotJoined):
		r.Status, r.Fix = Warn, fixJoin
		r.Message = "this node has not joined"
		if f.DataDir != "" {
			r.Message += fmt.Sprintf(" (no %s in %s)", datadir.IdentityFile, f.DataDir)
		}
	case errors.Is(f.LoadErr, fs.ErrPermission):
		r.Status, r.Message = Fail, f.LoadErr.Error()
		r.Fix = "run bcd doctor as root or as the user the data directory belongs to"
		if f.DataDir != "" {
			r.Fix = fmt.Sprintf("run bcd doctor as root or as the user %s belongs to", f.DataDir)
		}
	case f.LoadErr != nil:
		r.Status, r.Fix = Fail, rejoin
		r.Message = dropJoinAgain(f.LoadErr.Error())
	case leaf == nil:
		r.Status, r.Fix = Fail, rejoin
		r.Message = "the identity holds no node certificate"
	case f.Revoked != nil:
		r.Status, r.Fix = Fail, rejoin
		r.Message = RevokedMessage(nodeName(leaf), f.Revoked)
	case now.After(leaf.NotAfter):
		r.Status, r.Fix = Fail, rejoin
		r.Message = "the node certificate expired at " + rfc3339(leaf.NotAfter) + "; an expired certificate never renews"
	case now.Before(leaf.NotBefore):
		r.Status, r.Fix = Warn, fixClock
		r.Message = fmt.Sprintf("joined as %s, but the node certificate is valid only from %s; is this machine's clock behind?",
			nodeName(leaf), rfc3339(leaf.NotBefore))
	default:
		r.Status = Pass
		r.Message = fmt.Sprintf("joined as %s until %s", nodeName(leaf), rfc3339(leaf.NotAfter))
	}
	return r
}

// RevokedMessage says that node's certificate was revoked or refused, as
// the journal recorded it.
func RevokedMessage(node string, rv *Revocation) string {
	what := "the control plane revoked the certificate of node " + node
	if rv.Refused {
		what = "the control plane refused the certificate of node " + node
	}
	msg := what + " at " + rfc3339(rv.Time)
	if rv.Detail != "" {
		msg += " (" + oneLine(rv.Detail) + ")"
	}
	return msg + "; it can never renew"
}

// dropJoinAgain removes the "; join again: …" ending of an identity error,
// which the result's Fix says.
func dropJoinAgain(msg string) string {
	before, rest, found := strings.Cut(msg, "; join again: ")
	if !found {
		return msg
	}
	// Keep what follows the way back (the TPM hint), if anything.
	if _, after, ok := strings.Cut(rest, "; "); ok {
		return before + "; " + after
	}
	return before
}

// CheckConfig reports whether bcd's config at path loaded; loadErr is what
// loading it (with its pins) returned.
//
//   - nil: Pass "config <path> and its pins are valid".
//   - an error wrapping fs.ErrNotExist: Warn, with the fix to write the
//     config with the install script or to join with --server and the pins.
//   - an error wrapping fs.ErrPermission: Fail, with the fix to run bcd
//     doctor as a user that can read the config.
//   - any other error: Fail with the error, which names the setting, and the
//     fix "correct the setting named above in <path>".
func CheckConfig(path string, loadErr error) Result {
	r := Result{Name: NameConfig}
	switch {
	case loadErr == nil:
		r.Status = Pass
		r.Message = fmt.Sprintf("config %s and its pins are valid", path)
	case errors.Is(loadErr, fs.ErrNotExist):
		r.Status = Warn
		r.Message = fmt.Sprintf("config %s does not exist", path)
		r.Fix = fmt.Sprintf("write %s with the install script, or pass --server and the three pins to bcd join", path)
	case errors.Is(loadErr, fs.ErrPermission):
		r.Status, r.Message = Fail, loadErr.Error()
		r.Fix = fmt.Sprintf("run bcd doctor as root or as a user that can read %s", path)
	default:
		r.Status, r.Message = Fail, loadErr.Error()
		r.Fix = fmt.Sprintf("correct the setting named above in %s", path)
	}
	return r
}

// CheckClock reports how far the local clock is from the control plane's.
// offset is local time minus the control plane's time; err is the error
// reading the control plane's time, if any.
//
//   - err: Fail "cannot read the control plane's time: <err>", with the fix
//     to check the reachability check.
//   - |offset| up to 5 s: Pass "clock within <|offset|> of the control
//     plane".
//   - up to 30 s: Warn, and beyond 30 s Fail, since certificates and signed
//     calls fail beyond 30 s; both with the fix to synchronise the clock.
func CheckClock(offset time.Duration, err error) Result {
	r := Result{Name: NameClock}
	if err != nil {
		r.Status, r.Fix = Fail, fixClockErr
		r.Message = "cannot read the control plane's time: " + err.Error()
		return r
	}
	d := abs(offset)
	shown := d.Round(time.Millisecond)
	dir := "ahead of"
	if offset < 0 {
		dir = "behind"
	}
	switch {
	case d <= clockWarn:
		r.Status = Pass
		r.Message = fmt.Sprintf("clock within %s of the control plane", shown)
	case d <= clockFail:
		r.Status, r.Fix = Warn, fixClock
		r.Message = fmt.Sprintf("the clock is %s %s the control plane, more than %s", shown, dir, clockWarn)
	default:
		r.Status, r.Fix = Fail, fixClock
		r.Message = fmt.Sprintf("the clock is %s %s the control plane; certificates and signed calls fail beyond 30 s", shown, dir)
	}
	return r
}

// CheckReachable reports whether the control plane at server answered over
// TLS pinned to serving_ca_spki_pin; err is the dial's or the call's error.
//
//   - nil: Pass "control plane <server> answers over TLS pinned to
//     serving_ca_spki_pin".
//   - an error wrapping tlspin.ErrUntrusted (the server is not the one the
//     pins name): Fail, with the fix to check serving_ca_spki_pin against
//     pki-bundle.json.
//   - any other error: Fail, with the fix to check the network path to
//     server and that fleetd is running.
func CheckReachable(server string, err error) Result {
	r := Result{Name: NameReachable}
	switch {
	case err == nil:
		r.Status = Pass
		r.Message = fmt.Sprintf("control plane %s answers over TLS pinned to serving_ca_spki_pin", server)
	case errors.Is(err, tlspin.ErrUntrusted):
		r.Status, r.Fix = Fail, fixPin
		r.Message = dropWayBack(err.Error(), fixPin)
	default:
		r.Status = Fail
		r.Message = fmt.Sprintf("cannot reach the control plane %s: %v", server, err)
		r.Fix = fmt.Sprintf("check that %s is reachable from this machine (firewall, DNS) and that fleetd is running", server)
	}
	return r
}

// dropWayBack removes "; <wayBack>" from msg, which the result's Fix says.
func dropWayBack(msg, wayBack string) string {
	return strings.Replace(msg, "; "+wayBack, "", 1)
}

// nodeName returns the node id a node certificate names.
func nodeName(leaf *x509.Certificate) string {
	if leaf.Subject.CommonName != "" {
		return leaf.Subject.CommonName
	}
	if len(leaf.URIs) > 0 {
		return leaf.URIs[0].String()
	}
	return "an unnamed node"
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// abs returns |d|, saturating for the most negative Duration.
func abs(d time.Duration) time.Duration {
	if d >= 0 {
		return d
	}
	if -d < 0 {
		return time.Duration(1<<63 - 1)
	}
	return -d
}

// NamePermissions is the name of the permissions check.
const NamePermissions = "permissions"

// CheckPermissions reports the folders (data, credentials) whose modes or
// owners let another user change what they hold, and the token file others
// may read. problems are what fileperm.CheckDir returned for each folder
// (nil entries are fine folders); tokenFile, when set, is a join token
// file others may read (mode tokenMode).
//
//   - no problem: Pass "<what> not writable by others".
//   - a folder problem: Fail with each problem, the fix its chmod or chown.
//   - only a readable token file: Warn, with the fix chmod 600.
func CheckPermissions(checked string, problems []error, tokenFile string, tokenMode fs.FileMode) Result {
	r := Result{Name: NamePermissions}
	var msgs, fixes []string
	for _, p := range problems {
		if p == nil {
			continue
		}
		var pr *fileperm.Problem
		if errors.As(p, &pr) {
			msgs = append(msgs, pr.What+" "+pr.Path+" "+pr.Why)
			fixes = append(fixes, pr.Fix)
			continue
		}
		msgs = append(msgs, p.Error())
		fixes = append(fixes, "run bcd doctor as root or as the user the data directory belongs to")
	}
	switch {
	case len(msgs) > 0:
		r.Status = Fail
		r.Message = strings.Join(msgs, "; ") + ": another user could replace the identity"
		r.Fix = strings.Join(fixes, "; ")
	case tokenFile != "":
		r.Status = Warn
		r.Message = fmt.Sprintf("the join token %s is readable by others (mode %04o)", tokenFile, tokenMode.Perm())
		r.Fix = "chmod 600 " + tokenFile + ", or remove it once the machine has joined"
	default:
		r.Status = Pass
		r.Message = checked + " not writable by others"
	}
	return r
}

// NameTPM is the name of the TPM check.
const NameTPM = "tpm"

// TPMFacts are what the TPM check judges.
type TPMFacts struct {
	// KeyWhere says where the node key is: "file <path>", "TPM (<spec>)"
	// or "TPM through bcd helper (<socket>)"; empty when not joined.
	KeyWhere string
	// HelperUser is the [helper] user, empty without a helper.
	HelperUser string
	// HelperUserInTSS is true when that user is in the tss group, which
	// lets it open the TPM device itself.
	HelperUserInTSS bool
}

// CheckTPM fails while the [helper] user can open the TPM device (it is in
// the tss group): then the helper protects nothing. It reports where the
// node key is.
func CheckTPM(f TPMFacts) Result {
	r := Result{Name: NameTPM}
	where := f.KeyWhere
	if where == "" {
		where = "no node key yet"
	}
	if f.HelperUser != "" && f.HelperUserInTSS {
		r.Status = Fail
		r.Message = "the [helper] user " + f.HelperUser + " is in the tss group, so bcd node could open the TPM itself and clear it; node key: " + where
		r.Fix = "remove it from the group (gpasswd -d " + f.HelperUser + " tss), then restart bcd.service"
		return r
	}
	r.Status = Pass
	r.Message = "node key: " + where
	return r
}
