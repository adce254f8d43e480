//go:build tpmsim

package bootpolicy_test

import (
	"crypto/rand"
	"errors"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// TestSimEvaluate measures each boot of the policy table into the
// reference simulator, quotes PCRs 0–7 with an AK over a fresh nonce, and
// evaluates the quote with the log the node would send.
func TestSimEvaluate(t *testing.T) {
	f := newFixture(t)
	for _, c := range f.policyCases() {
		t.Run(c.name, func(t *testing.T) {
			tp, tr := tpmtest.OpenSim(t)
			c.measured.Extend(t, tr)
			evaluateQuoted(t, f, c, tp)
		})
	}
	t.Run("a quote over another nonce is not evidence", func(t *testing.T) {
		tp, tr := tpmtest.OpenSim(t)
		l := f.talosBoot()
		l.Extend(t, tr)
		ev := quoteBoot(t, tp, l.Bytes())
		ev.Quote.Nonce = randomNonce(t)
		v, err := f.policies.Evaluate("worker", bootpolicy.BootCheck, ev)
		if v != nil || !errors.Is(err, bootpolicy.ErrUnproven) {
			t.Fatalf("verdict %v, error %v; want ErrUnproven", v, err)
		}
	})
}

// evaluateQuoted quotes the TPM c.measured was extended into and checks
// the verdict on the quote and c's log.
func evaluateQuoted(t *testing.T, f *fixture, c policyCase, tp *tpm.TPM) {
	t.Helper()
	log := c.log
	if log == nil {
		log = c.measured.Bytes()
	}
	ev := quoteBoot(t, tp, log)
	for i, v := range c.measured.PCRs() {
		if string(ev.PCRs[i]) != string(v) {
			t.Fatalf("the TPM's PCR %d is %x, the log's replay %x", i, ev.PCRs[i], v)
		}
	}
	v, err := f.policies.Evaluate(c.class, c.stage, ev)
	if err != nil {
		t.Fatal(err)
	}
	if !v.QuoteVerified {
		t.Error("a quoted verdict says the quote was not verified")
	}
	checkVerdict(t, c, v)
}

// quoteBoot has a new AK quote PCRs 0–7 over a fresh nonce, as a node
// answering a boot check does.
func quoteBoot(t testing.TB, tp *tpm.TPM, log []byte) bootpolicy.Evidence {
	t.Helper()
	ak, _, err := tp.NewAK(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	nonce := randomNonce(t)
	q, sig, pcrs, err := tp.Quote(t.Context(), ak, nonce, tpm.BootPCRs)
	if err != nil {
		t.Fatal(err)
	}
	return bootpolicy.Evidence{
		Quote:    &bootpolicy.Quote{AKPublic: ak.PublicArea(), Attest: q, Signature: sig, Nonce: nonce},
		PCRs:     pcrs,
		EventLog: log,
	}
}

func randomNonce(t testing.TB) []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSimCapture captures a worker policy from a machine on the reference
// simulator (its boot extended into the TPM, quoted over a fresh nonce and
// the quote verified), then quotes a second machine whose shim differs:
// the golden machine passes its policy, the second fails boot_applications
// and nothing else.
func TestSimCapture(t *testing.T) {
	f := newFixture(t)
	var ps *bootpolicy.Policies
	t.Run("golden machine", func(t *testing.T) {
		tp, tr := tpmtest.OpenSim(t)
		golden := f.talosBoot()
		golden.Extend(t, tr)
		ev := quoteBoot(t, tp, golden.Bytes())
		if _, err := f.policies.Evaluate("lab", bootpolicy.BootCheck, ev); err != nil {
			t.Fatalf("the golden machine's quote: %v", err)
		}
		ps, _ = captureAndLoad(t, "worker", bootpolicy.Evidence{PCRs: ev.PCRs, EventLog: ev.EventLog})
		v, err := ps.Evaluate("worker", bootpolicy.Renewal, ev)
		if err != nil {
			t.Fatal(err)
		}
		if !v.Pass() || !v.QuoteVerified {
			t.Fatalf("the golden machine, quoted: %v (quote verified %v)", v.Failed, v.QuoteVerified)
		}
	})
	if ps == nil {
		t.FailNow()
	}
	t.Run("a machine with another shim", func(t *testing.T) {
		tp, tr := tpmtest.OpenSim(t)
		other := f.boot(true, app{f.talos, digestOf("shimx64.efi 15.9"), `\EFI\BOOT\BOOTX64.EFI`}, app{nil, f.kernel, `\EFI\Linux\talos.efi`})
		other.Extend(t, tr)
		v, err := ps.Evaluate("worker", bootpolicy.Renewal, quoteBoot(t, tp, other.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		if v.Pass() || len(v.Failed) != 1 || v.Failed[0] != bootpolicy.RuleBootApplications {
			t.Fatalf("failed %v, want boot_applications alone", v.Failed)
		}
	})
}
