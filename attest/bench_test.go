package attest_test

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The cost of each check on one core; a tpm join runs each once, a boot
// check runs VerifyQuote and ReplayEventLog. Run with
// go test -run '^$' -bench . ./attest/

func BenchmarkVerifyQuote(b *testing.B) {
	ak := newSoftAK(b)
	nonce := randomBytes(b, 32)
	pcrs := randomPCRs(b)
	q, sig := ak.quote(b, nonce, pcrs)
	b.ReportAllocs()
	for b.Loop() {
		if err := attest.VerifyQuote(ak.publicArea, q, sig, nonce, pcrs); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyCertify(b *testing.B) {
	ak := newSoftAK(b)
	key := newSoftKey(b, tpmpub.NodeKeyAttributes)
	csr := sha256.Sum256([]byte("a CSR"))
	a, sig := ak.certify(b, key.name(b), csr[:])
	b.ReportAllocs()
	for b.Loop() {
		if _, err := attest.VerifyCertify(ak.publicArea, a, sig, key.publicArea, csr[:]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplayEventLog replays a real 38 KB log (Ubuntu on a GCE
// Shielded VM, 119 events) against PCRs 0–7 and parses its Secure Boot
// state.
func BenchmarkReplayEventLog(b *testing.B) {
	log, pcrs := readTestLog(b, "ubuntu_2104_shielded_vm_no_secure_boot_eventlog")
	b.SetBytes(int64(len(log)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := attest.ReplayEventLog(log, pcrs); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewChallenge(b *testing.B) {
	ak := newSoftAK(b)
	rsaArea, _ := softRSAEK(b)
	eccArea, _ := softECCEK(b)
	for _, bc := range []struct {
		name string
		ek   []byte
	}{{"RSA2048", rsaArea}, {"ECCP256", eccArea}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := attest.NewChallenge(bc.ek, ak.publicArea, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkVerifyEKCertificate(b *testing.B) {
	root := tpmtest.NewManufacturer(b, "Test TPM Root CA", nil)
	inter := tpmtest.NewManufacturer(b, "Test TPM Intermediate CA", root)
	_, pub := softRSAEK(b)
	der := inter.EKCert(b, pub, tpmtest.EKCertOptions{})
	v := newVerifier(b, root, inter, time.Time{})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.VerifyEKCertificate(der, pub); err != nil {
			b.Fatal(err)
		}
	}
}
