package bootpolicy_test

import (
	"crypto/rand"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// TestSwtpmEvaluate measures each boot of the policy table into swtpm
// over TCP (reset before each, as a reboot resets its PCRs), quotes
// it, and evaluates the quote. It skips when swtpm is not installed (and
// fails under CI).
func TestSwtpmEvaluate(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpm(t)
	f := newFixture(t)
	for i, c := range f.policyCases() {
		t.Run(c.name, func(t *testing.T) {
			if i > 0 {
				sw.Reboot(t)
			}
			sw.ExtendLog(t, c.measured)
			tp, err := tpm.Open(sw.Spec())
			if err != nil {
				t.Fatal(err)
			}
			log := c.log
			if log == nil {
				log = c.measured.Bytes()
			}
			ak, _, err := tp.NewAK(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			nonce := make([]byte, 32)
			if _, err := rand.Read(nonce); err != nil {
				t.Fatal(err)
			}
			q, sig, pcrs, err := tp.Quote(t.Context(), ak, nonce, tpm.BootPCRs)
			if err != nil {
				t.Fatal(err)
			}
			akPublic := ak.PublicArea()
			if err := ak.Close(); err != nil {
				t.Fatal(err)
			}
			if err := tp.Close(); err != nil {
				t.Fatal(err)
			}
			v, err := f.policies.Evaluate(c.class, c.stage, bootpolicy.Evidence{
				Quote: &bootpolicy.Quote{AKPublic: akPublic, Attest: q, Signature: sig, Nonce: nonce},
				PCRs:  pcrs, EventLog: log,
			})
			if err != nil {
				t.Fatal(err)
			}
			if !v.QuoteVerified {
				t.Error("a quoted verdict says the quote was not verified")
			}
			checkVerdict(t, c, v)
			if objects, sessions := sw.Handles(t); objects != 0 || sessions != 0 {
				t.Errorf("%d objects and %d sessions left loaded in the swtpm", objects, sessions)
			}
		})
	}
}
