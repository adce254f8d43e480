package attest_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The fuzz targets feed arbitrary bytes to every parser of node-supplied
// evidence. Each must return an error wrapping its sentinel, never panic,
// and never accept what a real key did not sign. The seeds are valid
// evidence, so the fuzzer starts from the accepting path.

// pcrsFromBytes splits b into PCR values 0–7 of 32 bytes, as far as it goes.
func pcrsFromBytes(b []byte) map[int][]byte {
	m := map[int][]byte{}
	for i := 0; i < 8 && len(b) > 0; i++ {
		n := min(32, len(b))
		m[i], b = b[:n], b[n:]
	}
	return m
}

func pcrsToBytes(m map[int][]byte) []byte {
	var b []byte
	for i := range 8 {
		b = append(b, m[i]...)
	}
	return b
}

func FuzzVerifyQuote(f *testing.F) {
	ak := newSoftAK(f)
	nonce := randomBytes(f, 32)
	pcrs := randomPCRs(f)
	q, sig := ak.quote(f, nonce, pcrs)
	f.Add(ak.publicArea, q, sig, nonce, pcrsToBytes(pcrs))
	zq, zsig := ak.quote(f, nonce, zeroPCRs())
	f.Add(ak.publicArea, zq, zsig, nonce, pcrsToBytes(zeroPCRs()))
	f.Add([]byte{}, []byte{}, []byte{}, []byte{}, []byte{})
	f.Add(ak.publicArea, q[:len(q)/2], sig[:10], nonce[:16], []byte{1})
	f.Fuzz(func(t *testing.T, akArea, attestBytes, sigBytes, nonceBytes, pcrBytes []byte) {
		err := attest.VerifyQuote(akArea, attestBytes, sigBytes, nonceBytes, pcrsFromBytes(pcrBytes))
		if err != nil && !errors.Is(err, attest.ErrQuote) {
			t.Fatalf("error %v does not wrap ErrQuote", err)
		}
	})
}

func FuzzVerifyCertify(f *testing.F) {
	ak := newSoftAK(f)
	key := newSoftKey(f, tpmpub.NodeKeyAttributes)
	csr := sha256.Sum256([]byte("a CSR"))
	a, sig := ak.certify(f, key.name(f), csr[:])
	f.Add(ak.publicArea, a, sig, key.publicArea, csr[:])
	f.Add([]byte{}, []byte{}, []byte{}, []byte{}, []byte{})
	f.Add(key.publicArea, a, sig, ak.publicArea, csr[:])
	f.Fuzz(func(t *testing.T, akArea, attestBytes, sigBytes, keyArea, csrDigest []byte) {
		pub, err := attest.VerifyCertify(akArea, attestBytes, sigBytes, keyArea, csrDigest)
		if err != nil {
			if !errors.Is(err, attest.ErrCertify) {
				t.Fatalf("error %v does not wrap ErrCertify", err)
			}
			if pub != nil {
				t.Fatal("a key returned with an error")
			}
			return
		}
		if pub == nil {
			t.Fatal("accepted without returning the key")
		}
	})
}

func FuzzReplayEventLog(f *testing.F) {
	events := sampleEvents()
	f.Add(buildEventLog(events), pcrsToBytes(replayLog(events)))
	f.Add([]byte{}, pcrsToBytes(zeroPCRs()))
	for _, name := range []string{"sb_cert_eventlog", "ubuntu_2104_shielded_vm_no_secure_boot_eventlog"} {
		log, pcrs := readTestLog(f, name)
		f.Add(log, pcrsToBytes(pcrs))
	}
	f.Fuzz(func(t *testing.T, log, pcrBytes []byte) {
		got, err := attest.ReplayEventLog(log, pcrsFromBytes(pcrBytes))
		if err != nil {
			if !errors.Is(err, attest.ErrEventLog) {
				t.Fatalf("error %v does not wrap ErrEventLog", err)
			}
			return
		}
		if got == nil {
			t.Fatal("accepted without a result")
		}
	})
}

func FuzzNewChallenge(f *testing.F) {
	ak := newSoftAK(f)
	rsaArea, _ := softRSAEK(f)
	eccArea, _ := softECCEK(f)
	f.Add(rsaArea, ak.publicArea)
	f.Add(eccArea, ak.publicArea)
	f.Add(eccEKP384(f), ak.publicArea)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, ekArea, akArea []byte) {
		c, err := attest.NewChallenge(ekArea, akArea, nil)
		if err != nil {
			if !errors.Is(err, attest.ErrActivation) {
				t.Fatalf("error %v does not wrap ErrActivation", err)
			}
			return
		}
		// What is accepted is a well-formed EK and AK: the same areas
		// pass the public checks.
		if _, err := attest.EKPublic(ekArea); err != nil {
			t.Fatalf("NewChallenge accepted an EK public area EKPublic refuses: %v", err)
		}
		name, err := attest.AKName(akArea)
		if err != nil || string(name) != string(c.AKName) {
			t.Fatalf("NewChallenge bound the credential to %x; AKName says %x, %v", c.AKName, name, err)
		}
	})
}

func FuzzVerifyEKCertificate(f *testing.F) {
	root := tpmtest.NewManufacturer(f, "Test TPM Root CA", nil)
	_, pub := softECCEK(f)
	v := newVerifier(f, root, nil, timeZero)
	der := root.EKCert(f, pub, tpmtest.EKCertOptions{})
	f.Add(der)
	f.Add(append([]byte{0x10, 0x01, 0x00, byte(len(der) >> 8), byte(len(der))}, der...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		cert, err := v.VerifyEKCertificate(b, pub)
		if err != nil {
			if !errors.Is(err, attest.ErrUntrustedEK) {
				t.Fatalf("error %v does not wrap ErrUntrustedEK", err)
			}
			return
		}
		if cert == nil || !pub.Equal(cert.PublicKey) {
			t.Fatal("accepted a certificate of another key")
		}
	})
}

// FuzzVerifyEKCertificateChain feeds a node's EK certificate chain: the
// leaf is the manufacturer intermediate's, and the fuzzed bytes are the
// chain the node read from NV. Only the real intermediate may let it
// through; any error wraps ErrUntrustedEK.
func FuzzVerifyEKCertificateChain(f *testing.F) {
	root := tpmtest.NewManufacturer(f, "Test TPM Root CA", nil)
	inter := tpmtest.NewManufacturer(f, "Test TPM EK CA", root)
	_, pub := softECCEK(f)
	v := newVerifier(f, root, nil, timeZero)
	der := inter.EKCert(f, pub, tpmtest.EKCertOptions{})
	f.Add(inter.Cert.Raw, []byte{})
	f.Add(inter.Cert.Raw, root.Cert.Raw)
	f.Add([]byte("not a certificate"), []byte{})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var chain [][]byte
		for _, c := range [][]byte{a, b} {
			if len(c) > 0 {
				chain = append(chain, c)
			}
		}
		cert, err := v.VerifyEKCertificateChain(der, chain, pub)
		if err != nil {
			if !errors.Is(err, attest.ErrUntrustedEK) {
				t.Fatalf("error %v does not wrap ErrUntrustedEK", err)
			}
			return
		}
		if cert == nil || !pub.Equal(cert.PublicKey) {
			t.Fatal("accepted a certificate of another key")
		}
		if !bytes.Equal(a, inter.Cert.Raw) && !bytes.Equal(b, inter.Cert.Raw) {
			t.Fatal("trusted through a chain without the manufacturer's intermediate")
		}
	})
}
