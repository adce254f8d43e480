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
