package bootpolicy_test

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
)

// TestEvaluate runs every rule's passing and failing boot with PCR values
// taken as given (the offline check's way); TestSimEvaluate and
// TestSwtpmEvaluate run the same boots measured into a TPM and quoted.
func TestEvaluate(t *testing.T) {
	f := newFixture(t)
	for _, c := range f.policyCases() {
		t.Run(c.name, func(t *testing.T) {
			log := c.log
			if log == nil {
				log = c.measured.Bytes()
			}
			v, err := f.policies.Evaluate(c.class, c.stage, bootpolicy.Evidence{PCRs: c.measured.PCRs(), EventLog: log})
			if err != nil {
				t.Fatal(err)
			}
			checkVerdict(t, c, v)
			if v.QuoteVerified || !strings.Contains(strings.Join(v.Notes, "\n"), "quote was not verified") {
				t.Errorf("an unquoted verdict: quote verified %v, notes %q", v.QuoteVerified, v.Notes)
			}
		})
	}
}

func TestEvaluateVerdict(t *testing.T) {
	f := newFixture(t)
	l := f.talosBoot()
	v, err := f.policies.Evaluate("worker", bootpolicy.Renewal, bootpolicy.Evidence{PCRs: l.PCRs(), EventLog: l.Bytes()})
	if err != nil {
		t.Fatal(err)
	}
	if !v.Pass() || v.Time.Unix() != 1_800_000_000 {
		t.Fatalf("result %s at %s", v.Result, v.Time)
	}
	b := v.Boot
	if b == nil || b.SecureBoot != "on" || len(b.Authorities) != 1 || b.Authorities[0].Name != "Talos" {
		t.Fatalf("boot summary %+v", b)
	}
	if len(b.PK.Certificates) != 1 || len(b.KEK.Certificates) != 1 || len(b.DB.Certificates) != 3 || b.DBX.Hashes != 1 {
		t.Errorf("databases PK %+v KEK %+v db %+v dbx %+v", b.PK, b.KEK, b.DB, b.DBX)
	}
	if len(b.BootApplications) != 2 || b.BootApplications[0].Pin != "shim 15.8" || b.BootApplications[1].Pin != "Talos v1.11.5 UKI" ||
		b.BootApplications[0].Path != `\EFI\BOOT\BOOTX64.EFI` || len(b.BootApplications[0].VerifiedBy) != 1 || len(b.BootApplications[1].VerifiedBy) != 0 {
		t.Errorf("boot applications %+v", b.BootApplications)
	}
	if b.Kernel != hex.EncodeToString(f.kernel) {
		t.Errorf("kernel %s", b.Kernel)
	}
	// The JSON a verdict log line and `fleetd policy check --json` hold.
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"time", "class", "stage", "policy_sha256", "result", "quote_verified", "rules", "boot"} {
		if _, ok := m[k]; !ok {
			t.Errorf("verdict JSON has no %q: %s", k, j)
		}
	}
	if _, ok := m["failed"]; ok {
		t.Errorf("a passing verdict lists failed rules: %s", j)
	}
}

func TestEvaluateErrors(t *testing.T) {
	f := newFixture(t)
	l := f.talosBoot()
	pcrs := l.PCRs()
	for _, tc := range []struct {
		name   string
		class  string
		stage  bootpolicy.Stage
		ev     bootpolicy.Evidence
		target error
		substr string
	}{
		{"a class without a policy", "gpu", bootpolicy.Renewal, bootpolicy.Evidence{PCRs: pcrs, EventLog: l.Bytes()}, bootpolicy.ErrUnknownClass, `"gpu"`},
		{"an empty class", "", bootpolicy.Intake, bootpolicy.Evidence{PCRs: pcrs}, bootpolicy.ErrUnknownClass, "control-plane, install, lab, worker"},
		{"an unknown stage", "worker", "reboot", bootpolicy.Evidence{PCRs: pcrs}, bootpolicy.ErrEvidence, "unknown stage"},
		{"no PCR values", "worker", bootpolicy.Renewal, bootpolicy.Evidence{EventLog: l.Bytes()}, bootpolicy.ErrEvidence, "PCR 0"},
		{"a SHA-1 PCR value", "worker", bootpolicy.Renewal, bootpolicy.Evidence{PCRs: withPCR(pcrs, 3, make([]byte, 20))}, bootpolicy.ErrEvidence, "PCR 3 value of 20 bytes"},
		{"a PCR beyond 0-7", "worker", bootpolicy.Renewal, bootpolicy.Evidence{PCRs: withPCR(pcrs, 8, make([]byte, 32))}, bootpolicy.ErrEvidence, "PCRs 0-7 alone"},
		{"a quote that is not one", "worker", bootpolicy.Renewal, bootpolicy.Evidence{PCRs: pcrs, EventLog: l.Bytes(),
			Quote: &bootpolicy.Quote{AKPublic: []byte("ak"), Attest: []byte("q"), Signature: []byte("s"), Nonce: make([]byte, 32)}}, bootpolicy.ErrUnproven, "quote refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := f.policies.Evaluate(tc.class, tc.stage, tc.ev)
			if v != nil || !errors.Is(err, tc.target) || !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("verdict %v, error %v; want %v mentioning %q", v, err, tc.target, tc.substr)
			}
		})
	}
}

func withPCR(m map[int][]byte, i int, v []byte) map[int][]byte {
	out := map[int][]byte{}
	for k, x := range m {
		out[k] = x
	}
	out[i] = v
	return out
}
