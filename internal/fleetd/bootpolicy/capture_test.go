package bootpolicy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gattest "github.com/google/go-attestation/attest"
	evtestdata "github.com/google/go-eventlog/testdata"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
)

// rhel8PCRs are the SHA-256 PCR values go-eventlog's Rhel8 GCE log replays
// to (go-eventlog's tpmeventlog/replay_test.go; attest/reallogs_test.go
// carries them too).
var rhel8PCRs = [8]string{
	"24af52a4f429b71a3184a6d64cddad17e54ea030e2aa6576bf3a5a3d8bd3328f",
	"454220afaa80c83c3839f6cccd8b3c88bf4f562316a9dda1121c578c9e005a53",
	"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
	"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
	"758a3d35f1b0ff5b135dacd07db0c8132c0ac665d944090d4bf96e66447a245c",
	"53d0ee36163219201e686167bbb71ec505b3ba2917b9d9183ed84aad26cfeb89",
	"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
	"5fd54361d580eb7592adb8deb236ff35444ceeac7148f24b3de63c041f12b3da",
}

// rhel8Grub is the digest of the log's second boot application (grub).
const rhel8Grub = "e8a268c431da72caaae407f729f602b9dbf5d1d43492d4a51cc2b688a08586e3"

func hexPCRs(t *testing.T, vals [8]string) map[int][]byte {
	t.Helper()
	m := map[int][]byte{}
	for i, s := range vals {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		m[i] = b
	}
	return m
}

// foldPCRs computes the SHA-256 PCR values of log's events, unverified,
// with go-attestation's parser: what a TPM that measured this log holds.
func foldPCRs(t *testing.T, log []byte) map[int][]byte {
	t.Helper()
	el, err := gattest.ParseEventLog(log)
	if err != nil {
		t.Fatal(err)
	}
	m := map[int][]byte{}
	for i := range 8 {
		m[i] = make([]byte, sha256.Size)
	}
	for _, e := range el.Events(gattest.HashSHA256) {
		if e.Index > 7 || e.Type == 3 { // EV_NO_ACTION is not extended
			continue
		}
		h := sha256.New()
		h.Write(m[e.Index])
		h.Write(e.Digest)
		m[e.Index] = h.Sum(nil)
	}
	return m
}

// captureAndLoad captures a policy of class from ev, writes it to a new
// policy directory and loads it.
func captureAndLoad(t *testing.T, class string, ev bootpolicy.Evidence) (*bootpolicy.Policies, []byte) {
	t.Helper()
	content, v, err := bootpolicy.Capture(bootpolicy.CaptureOptions{Class: class, EventLog: ev.EventLog, PCRs: ev.PCRs, Source: "a test"})
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	if !v.Pass() {
		t.Fatalf("capture returned a failing verdict: %v", v.Failed)
	}
	dir := t.TempDir()
	if err := bootpolicy.WriteNew(filepath.Join(dir, class+".toml"), content); err != nil {
		t.Fatal(err)
	}
	if err := bootpolicy.WriteNew(filepath.Join(dir, class+".toml"), content); err == nil {
		t.Error("WriteNew replaced an existing file")
	}
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
	if err != nil {
		t.Fatalf("the captured policy does not load: %v\n%s", err, content)
	}
	return ps, content
}

// TestCaptureRealLog captures a policy from go-eventlog's RHEL 8 firmware
// log (Secure Boot on, shim, grub and the kernel verified by Red Hat's
// and Microsoft's authorities): the source machine passes at intake and
// at renewal; the same boot with grub replaced (the log's digest changed
// and the PCRs a TPM would then hold) fails boot_applications and nothing
// else; a log that does not replay is refused.
func TestCaptureRealLog(t *testing.T) {
	pcrs := hexPCRs(t, rhel8PCRs)
	ev := bootpolicy.Evidence{PCRs: pcrs, EventLog: evtestdata.Rhel8EventLog}
	ps, content := captureAndLoad(t, "rhel8-gce", ev)
	for _, want := range []string{"secure_boot = true", "[[allowed_authorities]]", "sha256:" + rhel8Grub, "index = 7", "PCR 1: platform configuration: per machine", "PCR 5:"} {
		if !bytes.Contains(content, []byte(want)) {
			t.Errorf("the captured file lacks %q:\n%s", want, content)
		}
	}
	if bytes.Contains(content, []byte("index = 1\n")) || bytes.Contains(content, []byte("index = 5\n")) {
		t.Errorf("the capture pins a per-machine PCR:\n%s", content)
	}
	for _, st := range []bootpolicy.Stage{bootpolicy.Intake, bootpolicy.Renewal, bootpolicy.BootCheck} {
		v, err := ps.Evaluate("rhel8-gce", st, ev)
		if err != nil {
			t.Fatal(err)
		}
		if !v.Pass() || v.Matched != bootpolicy.MatchedCurrent {
			t.Fatalf("%s: the source machine: %v (matched %q)", st, v.Failed, v.Matched)
		}
	}

	grub, _ := hex.DecodeString(rhel8Grub)
	other := sha256.Sum256([]byte("another grub"))
	if bytes.Count(evtestdata.Rhel8EventLog, grub) != 1 {
		t.Fatal("grub's digest is not once in the log")
	}
	changed := bytes.Replace(evtestdata.Rhel8EventLog, grub, other[:], 1)
	v, err := ps.Evaluate("rhel8-gce", bootpolicy.Renewal, bootpolicy.Evidence{PCRs: foldPCRs(t, changed), EventLog: changed})
	if err != nil {
		t.Fatal(err)
	}
	if v.Pass() || !slices.Equal(v.Failed, []string{bootpolicy.RuleBootApplications}) {
		t.Fatalf("a machine with grub changed: failed %v, want boot_applications alone", v.Failed)
	}

	pcrs[4] = other[:]
	if _, _, err := bootpolicy.Capture(bootpolicy.CaptureOptions{Class: "x", EventLog: evtestdata.Rhel8EventLog, PCRs: pcrs}); err == nil || !strings.Contains(err.Error(), "replays") {
		t.Fatalf("capture from a log that does not replay: %v", err)
	}
}

// TestCaptureFixture captures from the fixture's worker boot (offline):
// the other boots of the table that differ in one boot application or an
// authority fail it, and --pin-pcrs changes what is pinned.
func TestCaptureFixture(t *testing.T) {
	f := newFixture(t)
	l := f.talosBoot()
	ps, _ := captureAndLoad(t, "worker", bootpolicy.Evidence{PCRs: l.PCRs(), EventLog: l.Bytes()})
	newKernel := f.boot(true, app{f.talos, f.shim, `\EFI\BOOT\BOOTX64.EFI`}, app{nil, f.unknownKernel, `\EFI\Linux\talos.efi`})
	rogue := f.boot(true, app{f.rogue, f.shim, `\EFI\BOOT\BOOTX64.EFI`}, app{nil, f.kernel, `\EFI\Linux\talos.efi`})
	for _, c := range []struct {
		name   string
		l      []byte
		pcrs   map[int][]byte
		failed []string
	}{
		{"the kernel changed", newKernel.Bytes(), newKernel.PCRs(), []string{bootpolicy.RuleBootApplications}},
		{"shim verified by another authority", rogue.Bytes(), rogue.PCRs(), []string{bootpolicy.RuleAllowedAuthorities, bootpolicy.RulePCRValues}},
	} {
		v, err := ps.Evaluate("worker", bootpolicy.Renewal, bootpolicy.Evidence{PCRs: c.pcrs, EventLog: c.l})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(v.Failed, c.failed) {
			t.Errorf("%s: failed %v, want %v", c.name, v.Failed, c.failed)
		}
	}
	content, _, err := bootpolicy.Capture(bootpolicy.CaptureOptions{Class: "worker", EventLog: l.Bytes(), PCRs: l.PCRs(), PinPCRs: []int{}})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(content, []byte("[[pcr_values]]")) {
		t.Error("an empty --pin-pcrs pinned a PCR")
	}
	if _, _, err := bootpolicy.Capture(bootpolicy.CaptureOptions{Class: "worker", EventLog: l.Bytes(), PCRs: l.PCRs(), PinPCRs: []int{9}}); err == nil {
		t.Error("PCR 9 pinned")
	}
}

// nextPolicy is the fixture's worker policy with a next state that pins a
// new kernel, in the window [from, from+24h).
func nextPolicy(t *testing.T, f *fixture, from time.Time) string {
	t.Helper()
	path := filepath.Join(f.dir, "worker.toml")
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	next := "\n# The Talos 1.12 rollout.\n[next]\ndescription = \"Talos v1.12 UKI\"\nnot_before = " + from.UTC().Format(time.RFC3339) +
		"\nnot_after = " + from.Add(24*time.Hour).UTC().Format(time.RFC3339) + `

[[next.boot_applications]]
name = "shim 15.8"
sha256 = "` + hex.EncodeToString(f.shim) + `"

[[next.boot_applications]]
name = "Talos v1.12 UKI"
sha256 = "` + hex.EncodeToString(f.unknownKernel) + `"
`
	writeFile(t, path, append(old, next...))
	return path
}

// TestNextState is a rollout: the current kernel and the next one both
// pass inside the window and the verdict says which matched; before the
// window and after it, only the current state passes; after promote only
// the next one does, the file is rewritten atomically with a backup, and
// a second promote finds nothing to promote.
func TestNextState(t *testing.T) {
	f := newFixture(t)
	from := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	path := nextPolicy(t, f, from)
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: f.dir})
	if err != nil {
		t.Fatal(err)
	}
	p, err := ps.Policy("worker")
	if err != nil {
		t.Fatal(err)
	}
	cur := f.talosBoot()
	next := f.boot(true, app{f.talos, f.shim, `\EFI\BOOT\BOOTX64.EFI`}, app{nil, f.unknownKernel, `\EFI\Linux\talos.efi`})
	neither := f.boot(true, app{f.talos, f.shim, `\EFI\BOOT\BOOTX64.EFI`}, app{nil, f.installer, `\EFI\Linux\talos.efi`})
	eval := func(p *bootpolicy.Policy, l interface {
		Bytes() []byte
		PCRs() map[int][]byte
	}, at time.Time) *bootpolicy.Verdict {
		t.Helper()
		v, err := p.Evaluate(bootpolicy.Renewal, bootpolicy.Evidence{PCRs: l.PCRs(), EventLog: l.Bytes()}, at)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	inside, before, after := from.Add(time.Hour), from.Add(-time.Hour), from.Add(25*time.Hour)
	for _, c := range []struct {
		name string
		l    interface {
			Bytes() []byte
			PCRs() map[int][]byte
		}
		at      time.Time
		matched string // "" for a failing verdict
		note    string
	}{
		{"current, inside the window", cur, inside, bootpolicy.MatchedCurrent, "not the next one"},
		{"next, inside the window", next, inside, bootpolicy.MatchedNext, "matches the next state"},
		{"neither, inside the window", neither, inside, "", "the next state failed too"},
		{"current, before the window", cur, before, bootpolicy.MatchedCurrent, "not evaluated before its window"},
		{"next, before the window", next, before, "", "not evaluated before its window"},
		{"current, after the window", cur, after, bootpolicy.MatchedCurrent, "unpromoted"},
		{"next, after the window", next, after, "", "unpromoted"},
	} {
		v := eval(p, c.l, c.at)
		if v.Matched != c.matched || v.Pass() != (c.matched != "") {
			t.Errorf("%s: pass %v, matched %q, failed %v; want matched %q", c.name, v.Pass(), v.Matched, v.Failed, c.matched)
		}
		if !strings.Contains(strings.Join(v.Notes, "\n"), c.note) {
			t.Errorf("%s: notes %q lack %q", c.name, v.Notes, c.note)
		}
		if c.name == "neither, inside the window" && !slices.Equal(v.NextFailed, []string{bootpolicy.RuleBootApplications}) {
			t.Errorf("%s: next_failed %v", c.name, v.NextFailed)
		}
	}
	// A next state that keeps the current pins matches both.
	writeFile(t, filepath.Join(f.dir, "both.toml"), []byte(`class = "both"
secure_boot = false
[[allowed_authorities]]
name = "Talos"
file = "certs/talos.pem"
[next]
not_before = 2026-12-01T00:00:00Z
not_after = 2026-12-02T00:00:00Z
secure_boot = true
[[next.allowed_authorities]]
name = "Talos"
file = "certs/talos.pem"
`))
	ps2, err := bootpolicy.Load(bootpolicy.Config{Dir: f.dir})
	if err != nil {
		t.Fatal(err)
	}
	both, _ := ps2.Policy("both")
	if v := eval(both, cur, inside); v.Matched != bootpolicy.MatchedBoth {
		t.Errorf("a boot both states allow: matched %q", v.Matched)
	}

	old, _ := os.ReadFile(path)
	pr, err := bootpolicy.Promote(path, after)
	if err != nil {
		t.Fatal(err)
	}
	if !pr.Late || pr.Early || pr.Description != "Talos v1.12 UKI" {
		t.Errorf("promotion %+v", pr)
	}
	if b, _ := os.ReadFile(pr.Backup); !bytes.Equal(b, old) {
		t.Error("the backup is not the previous file")
	}
	ps3, err := bootpolicy.Load(bootpolicy.Config{Dir: f.dir})
	if err != nil {
		t.Fatalf("the promoted file does not load: %v", err)
	}
	promoted, _ := ps3.Policy("worker")
	if promoted.Next != nil {
		t.Fatal("the promoted policy still has a next state")
	}
	// The rest of the current state stayed: required authorities, the
	// authority given by file.
	if !slices.Equal(promoted.RenewRequired, []string{"Talos"}) || len(promoted.Allowed) != 2 {
		t.Errorf("the promoted policy lost current rules: %+v", promoted)
	}
	if v := eval(promoted, next, inside); !v.Pass() || v.Matched != bootpolicy.MatchedCurrent {
		t.Errorf("the next boot after promotion: %v", v.Failed)
	}
	if v := eval(promoted, cur, inside); v.Pass() {
		t.Error("the old boot passes after promotion")
	}
	newFile, _ := os.ReadFile(path)
	if !bytes.Contains(newFile, []byte("comments of the previous file are not kept")) || !bytes.Contains(newFile, []byte(`file = "certs/talos.pem"`)) {
		t.Errorf("the promoted file:\n%s", newFile)
	}
	if _, err := bootpolicy.Promote(path, after); err == nil || !strings.Contains(err.Error(), "no [next] state") {
		t.Errorf("a second promote: %v", err)
	}
	if ents, _ := os.ReadDir(f.dir); slices.ContainsFunc(ents, func(e os.DirEntry) bool { return strings.HasSuffix(e.Name(), ".tmp") }) {
		t.Error("a temporary file is left")
	}
}

// TestNextRefused: a [next] without its window, with an inverted or
// too long one, or with no rule, refuses the file, as does a bad
// pcr_values entry.
func TestNextRefused(t *testing.T) {
	for name, c := range map[string]struct{ body, says string }{
		"no window":     {"[next]\nsecure_boot = true\n", "not_before and not_after are required"},
		"inverted":      {"[next]\nnot_before = 2026-12-02T00:00:00Z\nnot_after = 2026-12-01T00:00:00Z\nsecure_boot = true\n", "is not before"},
		"too long":      {"[next]\nnot_before = 2026-01-01T00:00:00Z\nnot_after = 2027-06-01T00:00:00Z\nsecure_boot = true\n", "longer than"},
		"no rule":       {"[next]\nnot_before = 2026-12-01T00:00:00Z\nnot_after = 2026-12-02T00:00:00Z\n", "gives no rule"},
		"unknown key":   {"[next]\nnot_before = 2026-12-01T00:00:00Z\nnot_after = 2026-12-02T00:00:00Z\nsecureboot = true\n", "unknown setting next.secureboot"},
		"pcr 9":         {"[[pcr_values]]\nindex = 9\nsha256 = \"" + strings.Repeat("0", 64) + "\"\n", "0 to 7"},
		"pcr no index":  {"[[pcr_values]]\nsha256 = \"" + strings.Repeat("0", 64) + "\"\n", "0 to 7"},
		"pcr twice":     {"[[pcr_values]]\nindex = 0\nsha256 = \"" + strings.Repeat("0", 64) + "\"\n[[pcr_values]]\nindex = 0\nsha256 = \"" + strings.Repeat("1", 64) + "\"\n", "pinned twice"},
		"next sb alone": {"[next]\nnot_before = 2026-12-01T00:00:00Z\nnot_after = 2026-12-02T00:00:00Z\nsecure_boot = true\n", "next.allowed_authorities: Secure Boot is required"},
	} {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "lab.toml"), []byte("class = \"lab\"\nsecure_boot = false\n"+c.body))
		_, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
	}
}

// TestCountStatus counts each node's latest verdict per class.
func TestCountStatus(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2026, 12, 1, h, 0, 0, 0, time.UTC) }
	v := func(node, class string, h int, result, matched string) bootpolicy.Verdict {
		return bootpolicy.Verdict{NodeID: node, Class: class, Time: at(h), Result: result, Matched: matched}
	}
	got := bootpolicy.CountStatus([]bootpolicy.Verdict{
		v("n1", "worker", 1, "pass", "current"), v("n1", "worker", 3, "pass", "next"), // n1 moved to next
		v("n2", "worker", 2, "pass", "current"),
		v("n3", "worker", 4, "fail", ""), v("n3", "worker", 1, "pass", "both"), // the latest fails
		v("n4", "worker", 2, "pass", "both"),
		v("c1", "control-plane", 2, "pass", "current"),
		v("", "worker", 9, "pass", "next"), // an offline check
	})
	want := []bootpolicy.ClassStatus{
		{Class: "control-plane", Nodes: 1, Current: 1, Latest: at(2)},
		{Class: "worker", Nodes: 4, Current: 1, Next: 1, Both: 1, Failing: 1, Latest: at(4)},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// TestReadVerdictLogs reads back what VerdictLog wrote, across a rotation,
// and counts a cut line.
func TestReadVerdictLogs(t *testing.T) {
	dir := t.TempDir()
	vl, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: dir, MaxBytes: bootpolicy.MinVerdictLogMaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 1000)
	for i := range 100 {
		if err := vl.Append(&bootpolicy.Verdict{NodeID: "n" + string(rune('a'+i%5)), Class: "worker", Result: "pass", Matched: "current", Time: time.Unix(int64(i), 0), Notes: []string{pad}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := vl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, bootpolicy.VerdictLogName+".1")); err != nil {
		t.Fatalf("no rotation happened: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, bootpolicy.VerdictLogName), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"node_id":"cut`)
	f.Close()
	vs, bad, err := bootpolicy.ReadVerdictLogs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if bad != 1 || len(vs) != 100 {
		t.Fatalf("%d verdicts, %d bad lines; want 100 and 1", len(vs), bad)
	}
	if st := bootpolicy.CountStatus(vs); len(st) != 1 || st[0].Nodes != 5 || st[0].Current != 5 {
		t.Fatalf("status %+v", st)
	}
	if _, _, err := bootpolicy.ReadVerdictLogs(t.TempDir()); err == nil {
		t.Error("an empty directory has verdicts")
	}
}
