//go:build tpmsim

package bootpolicy_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	gattest "github.com/google/go-attestation/attest"
	evtestdata "github.com/google/go-eventlog/testdata"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/pki/pkitest"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The cost of a boot check on the server, on one core: verify the AK's
// quote, replay the log, read its boot state and check the policy. The
// boot is RHEL 8's on a GCE Shielded VM (go-eventlog's rhel8-uefi log:
// 82 events, 28 in PCRs 0–7, Secure Boot on, shim, GRUB and the kernel
// in PCR 4),
// re-encoded with SHA-256 digests only, measured into the simulator and
// quoted. Run with
//
//	CGO_ENABLED=1 go test -tags tpmsim -run '^$' -bench . ./internal/fleetd/bootpolicy/
func BenchmarkEvaluate(b *testing.B) {
	ps, ev := rhel8Evidence(b)
	b.Run("quote+replay+policy", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v, err := ps.Evaluate("rhel", bootpolicy.BootCheck, ev)
			if err != nil || !v.Pass() {
				b.Fatalf("%v %+v", err, v)
			}
		}
	})
	b.Run("replay+policy", func(b *testing.B) {
		noQuote := ev
		noQuote.Quote = nil
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ps.Evaluate("rhel", bootpolicy.BootCheck, noQuote); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The crypto floor: the one signature verification a boot check
	// cannot avoid, bare and as attest.VerifyQuote makes it (with the
	// parsing of the AK's public area, the quote and the signature).
	b.Run("floor: ECDSA P-256 verify", func(b *testing.B) {
		key := pkitest.NewKey(b)
		d := sha256.Sum256(ev.Quote.Attest)
		sig, err := ecdsa.SignASN1(rand.Reader, key, d[:])
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if !ecdsa.VerifyASN1(&key.PublicKey, d[:], sig) {
				b.Fatal("no")
			}
		}
	})
	b.Run("VerifyQuote", func(b *testing.B) {
		q := ev.Quote
		b.ReportAllocs()
		for b.Loop() {
			if err := attest.VerifyQuote(q.AKPublic, q.Attest, q.Signature, q.Nonce, ev.PCRs); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// rhel8Evidence measures the RHEL 8 log into the simulator, quotes it,
// and writes a policy that accepts exactly that boot.
func rhel8Evidence(b *testing.B) (*bootpolicy.Policies, bootpolicy.Evidence) {
	el, err := gattest.ParseEventLog(evtestdata.Rhel8EventLog)
	if err != nil {
		b.Fatal(err)
	}
	log := &tpmtest.EventLog{}
	for _, e := range el.Events(gattest.HashSHA256) {
		if e.Index > 7 || uint32(e.Type) == tpmtest.EvNoAction {
			continue
		}
		log.Add(tpmtest.Event{PCR: e.Index, Type: uint32(e.Type), Data: e.Data, Digest: e.Digest})
	}
	tp, tr := tpmtest.OpenSim(b)
	log.Extend(b, tr)
	ev := quoteBoot(b, tp, log.Bytes())

	replayed, err := attest.ReplayEventLog(ev.EventLog, ev.PCRs)
	if err != nil {
		b.Fatal(err)
	}
	bs := replayed.BootState()
	var p strings.Builder
	p.WriteString("class = \"rhel\"\nsecure_boot = true\nrenew_required_authorities = [\"authority-1\"]\n")
	for i, a := range bs.Authorities {
		fmt.Fprintf(&p, "[[allowed_authorities]]\nname = \"authority-%d\"\nsha256 = %q\n", i, hex.EncodeToString(a.SHA256[:]))
	}
	for i, a := range bs.BootApplications {
		fmt.Fprintf(&p, "[[boot_applications]]\nname = \"app-%d\"\nsha256 = %q\n", i, hex.EncodeToString(a.Digest[:]))
	}
	dir := b.TempDir()
	writeFile(b, filepath.Join(dir, "rhel.toml"), []byte(p.String()))
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d events, %d bytes of log, %d authorities, %d boot applications", len(replayed.Events), len(ev.EventLog), len(bs.Authorities), len(bs.BootApplications))
	return ps, ev
}
