package bootpolicy_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
)

// FuzzParsePCRs feeds arbitrary text to the parser of captured PCR
// values: it must not panic, and what it accepts is PCRs 0–7 of 32 bytes.
func FuzzParsePCRs(f *testing.F) {
	fx := newFixture(f)
	f.Add([]byte(pcrreadOutput(fx.talosBoot().PCRs())))
	f.Add([]byte("0: 00\n"))
	f.Add([]byte("sha256:\n  0 : 0x\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		pcrs, err := bootpolicy.ParsePCRs(b)
		if err != nil {
			return
		}
		if len(pcrs) != 8 {
			t.Fatalf("accepted %d PCRs", len(pcrs))
		}
		for i, v := range pcrs {
			if i < 0 || i > 7 || len(v) != 32 {
				t.Fatalf("accepted PCR %d of %d bytes", i, len(v))
			}
		}
	})
}

// FuzzEvaluate feeds arbitrary logs and PCR values to a policy: every
// outcome is a verdict or a documented error, never a panic, and a
// verdict is consistent and small whatever the log holds.
func FuzzEvaluate(f *testing.F) {
	fx := newFixture(f)
	for _, c := range fx.policyCases() {
		log := c.log
		if log == nil {
			log = c.measured.Bytes()
		}
		f.Add(log, pcrBytes(c.measured.PCRs()))
	}
	f.Add([]byte{}, make([]byte, 256))
	f.Fuzz(func(t *testing.T, log, pcrs []byte) {
		m := map[int][]byte{}
		for i := 0; i < 8 && len(pcrs) > 0; i++ {
			n := min(32, len(pcrs))
			m[i], pcrs = pcrs[:n], pcrs[n:]
		}
		v, err := fx.policies.Evaluate("worker", bootpolicy.BootCheck, bootpolicy.Evidence{PCRs: m, EventLog: log})
		if err != nil {
			if !errors.Is(err, bootpolicy.ErrEvidence) {
				t.Fatalf("error %v is not ErrEvidence", err)
			}
			return
		}
		if len(v.Rules) != 5 || v.Pass() != (len(v.Failed) == 0) {
			t.Fatalf("verdict %+v", v)
		}
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if len(j) > 256<<10 {
			t.Fatalf("a verdict of %d bytes", len(j))
		}
	})
}

func pcrBytes(m map[int][]byte) []byte {
	var b []byte
	for i := range 8 {
		b = append(b, m[i]...)
	}
	return b
}
