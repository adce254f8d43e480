//go:build tpmsim

package attest_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// These tests check the verifier against evidence a real TPM 2.0 (the
// in-process reference simulator) produces through package tpm, the node's
// client: what the node sends is what the verifier accepts, and each kind
// of forgery or mix-up is refused.

func newAK(t *testing.T, tp *tpm.TPM) *tpm.AK {
	t.Helper()
	ak, _, err := tp.NewAK(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ak.Close() })
	return ak
}

func newNodeKey(t *testing.T, tp *tpm.TPM) *tpm.Key {
	t.Helper()
	k, _, err := tp.NewNodeKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k
}

func ekOf(t *testing.T, tp *tpm.TPM, kind tpm.EKKind) *tpm.EK {
	t.Helper()
	ek, err := tp.EK(context.Background(), kind)
	if err != nil {
		t.Fatal(err)
	}
	return ek
}

// rawObject is a primary key the test made itself with TPM2_CreatePrimary,
// for templates package tpm does not make.
type rawObject struct {
	handle     tpm2.TPMHandle
	name       tpm2.TPM2BName
	publicArea []byte
}

func createPrimary(t *testing.T, tr transport.TPM, tmpl tpm2.TPMTPublic) rawObject {
	t.Helper()
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(tmpl),
	}.Execute(tr)
	if err != nil {
		t.Fatalf("TPM2_CreatePrimary: %v", err)
	}
	t.Cleanup(func() { _, _ = tpm2.FlushContext{FlushHandle: rsp.ObjectHandle}.Execute(tr) })
	return rawObject{handle: rsp.ObjectHandle, name: rsp.Name, publicArea: rsp.OutPublic.Bytes()}
}

// rawCertify has signer certify object with TPM2_Certify.
func rawCertify(t *testing.T, tr transport.TPM, signer, object rawObject, qualifyingData []byte) (attestBytes, sig []byte) {
	t.Helper()
	rsp, err := tpm2.Certify{
		ObjectHandle:   tpm2.AuthHandle{Handle: object.handle, Name: object.name, Auth: tpm2.PasswordAuth(nil)},
		SignHandle:     tpm2.AuthHandle{Handle: signer.handle, Name: signer.name, Auth: tpm2.PasswordAuth(nil)},
		QualifyingData: tpm2.TPM2BData{Buffer: qualifyingData},
		InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
	}.Execute(tr)
	if err != nil {
		t.Fatalf("TPM2_Certify: %v", err)
	}
	return rsp.CertifyInfo.Bytes(), tpm2.Marshal(rsp.Signature)
}

// extendPCR extends the SHA-256 bank of PCR i with digest, as firmware
// measuring an event does.
func extendPCR(t *testing.T, tr transport.TPM, i int, digest []byte) {
	t.Helper()
	if _, err := (tpm2.PCRExtend{
		PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(i), Auth: tpm2.PasswordAuth(nil)},
		Digests:   tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{{HashAlg: tpm2.TPMAlgSHA256, Digest: digest}}},
	}).Execute(tr); err != nil {
		t.Fatalf("TPM2_PCR_Extend of PCR %d: %v", i, err)
	}
}

func quote(t *testing.T, tp *tpm.TPM, ak *tpm.AK, nonce []byte, pcrs []int) (attestBytes, sig []byte, values map[int][]byte) {
	t.Helper()
	a, s, v, err := tp.Quote(context.Background(), ak, nonce, pcrs)
	if err != nil {
		t.Fatal(err)
	}
	return a, s, v
}

func requireIs(t *testing.T, err error, target error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatal("accepted")
	}
	t.Log(err)
	if !errors.Is(err, target) {
		t.Fatalf("error %v does not wrap %v", err, target)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not mention %q", err, substr)
	}
}

var ekKinds = []tpm.EKKind{tpm.EKRSA2048, tpm.EKECCP256, tpm.EKECCP384}

func TestSimEKCertificate(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)
	root := tpmtest.NewManufacturer(t, "Test TPM Root CA", nil)
	inter := tpmtest.NewManufacturer(t, "Test TPM Intermediate CA", root)
	v := newVerifier(t, root, inter, time.Time{})

	eks := map[tpm.EKKind]*tpm.EK{}
	pubs := map[tpm.EKKind]crypto.PublicKey{}
	for _, kind := range ekKinds {
		ek := ekOf(t, tp, kind)
		pub, err := attest.EKPublic(ek.PublicArea)
		if err != nil {
			t.Fatalf("EKPublic of the simulator's %s EK: %v", kind, err)
		}
		eks[kind], pubs[kind] = ek, pub
		// As a manufacturer provisions it: the certificate in its NV
		// index, larger than the certificate.
		der := inter.EKCert(t, pub, tpmtest.EKCertOptions{})
		tpmtest.WriteNV(t, tr, kind.CertIndex(), der, len(der)+300)
	}
	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range ekKinds {
		t.Run(kind.String()+" EK certificate from NV", func(t *testing.T) {
			cert, err := v.VerifyEKCertificate(certs[kind.CertIndex()], pubs[kind])
			if err != nil {
				t.Fatal(err)
			}
			pin, err := attest.EKPin(pubs[kind])
			if err != nil {
				t.Fatal(err)
			}
			if pin != pki.PinOfCert(cert).String() {
				t.Fatalf("EKPin %s differs from the certificate's key pin %s", pin, pki.PinOfCert(cert))
			}
		})
	}

	rsaCert := certs[tpm.EKCertIndexRSA2048]
	t.Run("a certificate of another manufacturer", func(t *testing.T) {
		_, err := newVerifier(t, tpmtest.NewManufacturer(t, "Another Root CA", nil), nil, time.Time{}).VerifyEKCertificate(rsaCert, pubs[tpm.EKRSA2048])
		requireIs(t, err, attest.ErrUntrustedEK, "unknown authority")
	})
	t.Run("the intermediate not configured", func(t *testing.T) {
		_, err := newVerifier(t, root, nil, time.Time{}).VerifyEKCertificate(rsaCert, pubs[tpm.EKRSA2048])
		requireIs(t, err, attest.ErrUntrustedEK, "unknown authority")
	})
	t.Run("checked after it expired", func(t *testing.T) {
		_, err := newVerifier(t, root, inter, time.Now().Add(50*365*24*time.Hour)).VerifyEKCertificate(rsaCert, pubs[tpm.EKRSA2048])
		requireIs(t, err, attest.ErrUntrustedEK, "expired")
	})
	t.Run("the RSA EK's certificate for the P-256 EK", func(t *testing.T) {
		_, err := v.VerifyEKCertificate(rsaCert, pubs[tpm.EKECCP256])
		requireIs(t, err, attest.ErrUntrustedEK, "another key")
	})
	t.Run("a valid certificate of an EK of another TPM", func(t *testing.T) {
		_, other := softRSAEK(t)
		_, err := v.VerifyEKCertificate(inter.EKCert(t, other, tpmtest.EKCertOptions{}), pubs[tpm.EKRSA2048])
		requireIs(t, err, attest.ErrUntrustedEK, "another key")
	})
	t.Run("a certificate with a forged TPM SAN", func(t *testing.T) {
		attrs := append([]pkix.AttributeTypeAndValue{{Type: oidCommonName, Value: "x"}}, tpmtest.DefaultTPMAttributes...)
		der := inter.EKCert(t, pubs[tpm.EKECCP256], tpmtest.EKCertOptions{Extensions: []pkix.Extension{tpmtest.TPMSAN(t, true, attrs)}})
		_, err := v.VerifyEKCertificate(der, pubs[tpm.EKECCP256])
		requireIs(t, err, attest.ErrUntrustedEK, "subjectAltName")
	})
}

func TestSimActivation(t *testing.T) {
	ctx := context.Background()
	tp, _ := tpmtest.OpenSim(t)
	ak := newAK(t, tp)
	ak2 := newAK(t, tp)
	eks := map[tpm.EKKind]*tpm.EK{}
	for _, kind := range ekKinds {
		eks[kind] = ekOf(t, tp, kind)
	}

	for _, kind := range ekKinds {
		t.Run(kind.String()+" EK: the TPM answers, the answer checks", func(t *testing.T) {
			c, err := attest.NewChallenge(eks[kind].PublicArea, ak.PublicArea(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(c.AKName, ak.Name()) {
				t.Fatalf("the challenge is bound to %x, the TPM names the AK %x", c.AKName, ak.Name())
			}
			answer, err := tp.ActivateCredential(ctx, ak, eks[kind], c.CredentialBlob, c.EncryptedSecret)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Check(answer); err != nil {
				t.Fatal(err)
			}
		})
	}

	// requireNoAnswer runs TPM2_ActivateCredential and requires the TPM to
	// refuse: the node has no answer to give.
	requireNoAnswer := func(t *testing.T, a *tpm.AK, ek *tpm.EK, c *attest.Challenge) {
		t.Helper()
		answer, err := tp.ActivateCredential(ctx, a, ek, c.CredentialBlob, c.EncryptedSecret)
		if err == nil {
			t.Fatalf("the TPM released %x", answer)
		}
		t.Log(err)
		// Whatever a node answers instead is refused.
		for _, guess := range [][]byte{answer, make([]byte, attest.SecretSize), randomBytes(t, attest.SecretSize)} {
			if err := c.Check(guess); !errors.Is(err, attest.ErrActivation) {
				t.Fatalf("Check(%x): %v, want ErrActivation", guess, err)
			}
		}
	}
	ek := eks[tpm.EKRSA2048]
	t.Run("a challenge for another AK", func(t *testing.T) {
		// The node claims ak2's public area but activates with ak (say
		// ak2 is a key it copied from elsewhere, or made in software).
		c, err := attest.NewChallenge(ek.PublicArea, ak2.PublicArea(), nil)
		if err != nil {
			t.Fatal(err)
		}
		requireNoAnswer(t, ak, ek, c)
	})
	t.Run("an AK made in software", func(t *testing.T) {
		c, err := attest.NewChallenge(ek.PublicArea, newSoftAK(t).publicArea, nil)
		if err != nil {
			t.Fatal(err)
		}
		requireNoAnswer(t, ak, ek, c)
	})
	t.Run("a challenge for another EK of this TPM", func(t *testing.T) {
		c, err := attest.NewChallenge(eks[tpm.EKECCP256].PublicArea, ak.PublicArea(), nil)
		if err != nil {
			t.Fatal(err)
		}
		requireNoAnswer(t, ak, ek, c)
	})
	t.Run("a challenge for the EK of another TPM", func(t *testing.T) {
		for _, other := range [][]byte{func() []byte { a, _ := softRSAEK(t); return a }(), func() []byte { a, _ := softECCEK(t); return a }()} {
			c, err := attest.NewChallenge(other, ak.PublicArea(), nil)
			if err != nil {
				t.Fatal(err)
			}
			requireNoAnswer(t, ak, ek, c)
			requireNoAnswer(t, ak, eks[tpm.EKECCP256], c)
		}
	})
	t.Run("the answer to another challenge", func(t *testing.T) {
		c1, err := attest.NewChallenge(ek.PublicArea, ak.PublicArea(), nil)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := attest.NewChallenge(ek.PublicArea, ak.PublicArea(), nil)
		if err != nil {
			t.Fatal(err)
		}
		a1, err := tp.ActivateCredential(ctx, ak, ek, c1.CredentialBlob, c1.EncryptedSecret)
		if err != nil {
			t.Fatal(err)
		}
		requireIs(t, c2.Check(a1), attest.ErrActivation, "not the challenge's secret")
		a1[0] ^= 1
		requireIs(t, c1.Check(a1), attest.ErrActivation, "not the challenge's secret")
	})
	t.Run("a node key is not an AK", func(t *testing.T) {
		key := newNodeKey(t, tp)
		_, err := attest.NewChallenge(ek.PublicArea, key.PublicArea(), nil)
		requireIs(t, err, attest.ErrAK, "restricted")
	})
}

func TestSimQuote(t *testing.T) {
	tp, tr := tpmtest.OpenSim(t)
	ak := newAK(t, tp)
	ak2 := newAK(t, tp)
	nonce := randomBytes(t, 32)
	q, sig, pcrs := quote(t, tp, ak, nonce, tpm.BootPCRs)

	t.Run("a fresh quote of a fresh TPM", func(t *testing.T) {
		if err := attest.VerifyQuote(ak.PublicArea(), q, sig, nonce, pcrs); err != nil {
			t.Fatal(err)
		}
		// The simulator, like a fresh swtpm, has PCRs 0–7 at zero and no
		// measurement log: the empty log replays.
		if _, err := attest.ReplayEventLog(nil, pcrs); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a replayed quote: another session's nonce", func(t *testing.T) {
		requireIs(t, attest.VerifyQuote(ak.PublicArea(), q, sig, randomBytes(t, 32), pcrs), attest.ErrQuote, "nonce")
	})
	t.Run("a tampered PCR value", func(t *testing.T) {
		for i := range 8 {
			bad := cloneMap(pcrs)
			bad[i][31] ^= 1
			requireIs(t, attest.VerifyQuote(ak.PublicArea(), q, sig, nonce, bad), attest.ErrQuote, "pcrDigest")
		}
	})
	t.Run("a quote signed by another AK", func(t *testing.T) {
		q2, sig2, pcrs2 := quote(t, tp, ak2, nonce, tpm.BootPCRs)
		requireIs(t, attest.VerifyQuote(ak.PublicArea(), q2, sig2, nonce, pcrs2), attest.ErrQuote, "not the AK's")
		requireIs(t, attest.VerifyQuote(ak.PublicArea(), q, sig2, nonce, pcrs), attest.ErrQuote, "not the AK's")
		// ak2's own quote verifies with ak2.
		if err := attest.VerifyQuote(ak2.PublicArea(), q2, sig2, nonce, pcrs2); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a quote of PCRs 0-6", func(t *testing.T) {
		q3, sig3, pcrs3 := quote(t, tp, ak, nonce, []int{0, 1, 2, 3, 4, 5, 6})
		pcrs3[7] = pcrs[7]
		requireIs(t, attest.VerifyQuote(ak.PublicArea(), q3, sig3, nonce, pcrs3), attest.ErrQuote, "bitmap")
	})
	t.Run("a certification signed by the AK", func(t *testing.T) {
		key := newNodeKey(t, tp)
		a, s, err := tp.Certify(context.Background(), ak, key, nonce)
		if err != nil {
			t.Fatal(err)
		}
		requireIs(t, attest.VerifyQuote(ak.PublicArea(), a, s, nonce, pcrs), attest.ErrQuote, "type")
	})
	t.Run("measured PCRs", func(t *testing.T) {
		extendPCR(t, tr, 4, randomBytes(t, 32))
		q4, sig4, pcrs4 := quote(t, tp, ak, nonce, tpm.BootPCRs)
		if err := attest.VerifyQuote(ak.PublicArea(), q4, sig4, nonce, pcrs4); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(pcrs4[4], pcrs[4]) {
			t.Fatal("PCR 4 did not change")
		}
		// The earlier values do not match the new quote.
		requireIs(t, attest.VerifyQuote(ak.PublicArea(), q4, sig4, nonce, pcrs), attest.ErrQuote, "pcrDigest")
	})
}

func TestSimCertify(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)
	// The simulator holds 3 transient objects at once: keys are loaded
	// for as long as they are needed.
	ak := newAK(t, tp)
	key := newNodeKey(t, tp)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-1"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256(csr)
	a, sig, err := tp.Certify(ctx, ak, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the AK certifies the node key over the CSR", func(t *testing.T) {
		pub, err := attest.VerifyCertify(ak.PublicArea(), a, sig, key.PublicArea(), digest[:])
		if err != nil {
			t.Fatal(err)
		}
		req, err := x509.ParseCertificateRequest(csr)
		if err != nil {
			t.Fatal(err)
		}
		if !pub.(*ecdsa.PublicKey).Equal(req.PublicKey) || !pub.(*ecdsa.PublicKey).Equal(key.Public()) {
			t.Fatal("the certified key is not the CSR's")
		}
	})
	t.Run("another CSR", func(t *testing.T) {
		other := sha256.Sum256(append(bytes.Clone(csr), 0))
		_, err := attest.VerifyCertify(ak.PublicArea(), a, sig, key.PublicArea(), other[:])
		requireIs(t, err, attest.ErrCertify, "extraData")
	})
	t.Run("another key's public area", func(t *testing.T) {
		key2 := newNodeKey(t, tp)
		_ = key2.Close()
		_, err := attest.VerifyCertify(ak.PublicArea(), a, sig, key2.PublicArea(), digest[:])
		requireIs(t, err, attest.ErrCertify, "names")
	})
	t.Run("certified by another AK", func(t *testing.T) {
		ak2 := newAK(t, tp)
		defer ak2.Close()
		a2, sig2, err := tp.Certify(ctx, ak2, key, digest[:])
		if err != nil {
			t.Fatal(err)
		}
		_, err = attest.VerifyCertify(ak.PublicArea(), a2, sig2, key.PublicArea(), digest[:])
		requireIs(t, err, attest.ErrCertify, "not the AK's")
		_, err = attest.VerifyCertify(ak2.PublicArea(), a, sig, key.PublicArea(), digest[:])
		requireIs(t, err, attest.ErrCertify, "not the AK's")
	})
	t.Run("a quote signed by the AK", func(t *testing.T) {
		q, s, _ := quote(t, tp, ak, digest[:], tpm.BootPCRs)
		_, err := attest.VerifyCertify(ak.PublicArea(), q, s, key.PublicArea(), digest[:])
		requireIs(t, err, attest.ErrCertify, "type")
	})

	// Keys package tpm does not make, certified by an AK made the same
	// way as package tpm's, all with raw TPM commands.
	_, _ = ak.Close(), key.Close()
	rawAK := createPrimary(t, tr, tpmpub.AKTemplate(randomBytes(t, 32)))
	t.Run("a raw node key (control)", func(t *testing.T) {
		k := createPrimary(t, tr, tpmpub.NodeKeyTemplate(randomBytes(t, 32)))
		a, s := rawCertify(t, tr, rawAK, k, digest[:])
		if _, err := attest.VerifyCertify(rawAK.publicArea, a, s, k.publicArea, digest[:]); err != nil {
			t.Fatal(err)
		}
	})
	for _, tc := range []struct {
		name  string
		attrs func(a *tpm2.TPMAObject)
	}{
		{"a key subject to dictionary-attack lockout", func(a *tpm2.TPMAObject) { a.NoDA = false }},
		{"a key that can also decrypt", func(a *tpm2.TPMAObject) { a.Decrypt = true }},
		{"a restricted key", func(a *tpm2.TPMAObject) { a.Restricted = true }},
		{"a key used by policy only", func(a *tpm2.TPMAObject) { a.UserWithAuth = false }},
		{"a duplicable key", func(a *tpm2.TPMAObject) { a.FixedTPM, a.FixedParent = false, false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attrs := tpmpub.NodeKeyAttributes
			tc.attrs(&attrs)
			tmpl := tpmpub.ECCSigningTemplate(attrs, randomBytes(t, 32))
			if attrs.Decrypt {
				// A key that both decrypts and signs takes no fixed
				// scheme (Part 2, section 12.2.3.6).
				tmpl.Parameters = tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
					Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
					Scheme:    tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
					CurveID:   tpm2.TPMECCNistP256,
					KDF:       tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
				})
			}
			k, ok := tryCreatePrimary(t, tr, tmpl)
			if !ok {
				t.Skip("the TPM does not make such a primary key")
			}
			a, s := rawCertify(t, tr, rawAK, k, digest[:])
			_, err := attest.VerifyCertify(rawAK.publicArea, a, s, k.publicArea, digest[:])
			requireIs(t, err, attest.ErrCertify, "node key public area")
		})
	}
}

// tryCreatePrimary is createPrimary for templates the TPM may refuse.
func tryCreatePrimary(t *testing.T, tr transport.TPM, tmpl tpm2.TPMTPublic) (rawObject, bool) {
	t.Helper()
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(tmpl),
	}.Execute(tr)
	if err != nil {
		t.Logf("TPM2_CreatePrimary: %v", err)
		return rawObject{}, false
	}
	t.Cleanup(func() { _, _ = tpm2.FlushContext{FlushHandle: rsp.ObjectHandle}.Execute(tr) })
	return rawObject{handle: rsp.ObjectHandle, name: rsp.Name, publicArea: rsp.OutPublic.Bytes()}, true
}

func TestSimEventLog(t *testing.T) {
	tp, tr := tpmtest.OpenSim(t)
	ak := newAK(t, tp)

	// Firmware measures a boot: each event extends its PCR and is logged.
	events := sampleEvents()
	for _, e := range events {
		if e.typ != evNoAction {
			extendPCR(t, tr, e.pcr, e.digestOf())
		}
	}
	log := buildEventLog(events)

	nonce := randomBytes(t, 32)
	q, sig, pcrs := quote(t, tp, ak, nonce, tpm.BootPCRs)
	if err := attest.VerifyQuote(ak.PublicArea(), q, sig, nonce, pcrs); err != nil {
		t.Fatal(err)
	}
	t.Run("the log replays to the quoted PCRs", func(t *testing.T) {
		got, err := attest.ReplayEventLog(log, pcrs)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Events) != len(events) || got.SecureBoot == nil {
			t.Fatalf("%d events, Secure Boot %v", len(got.Events), got.SecureBoot)
		}
	})
	t.Run("a log missing an event", func(t *testing.T) {
		_, err := attest.ReplayEventLog(buildEventLog(events[1:]), pcrs)
		requireIs(t, err, attest.ErrEventLog, "replay")
	})
	t.Run("an empty log for a measured boot", func(t *testing.T) {
		_, err := attest.ReplayEventLog(nil, pcrs)
		requireIs(t, err, attest.ErrEventLog, "no event")
	})
	t.Run("a PCR extended without a log event", func(t *testing.T) {
		// Something measured into PCR 1 and the log says nothing about
		// PCR 1: the quote is genuine, the log does not explain it.
		extendPCR(t, tr, 1, randomBytes(t, 32))
		nonce := randomBytes(t, 32)
		q, sig, pcrs := quote(t, tp, ak, nonce, tpm.BootPCRs)
		if err := attest.VerifyQuote(ak.PublicArea(), q, sig, nonce, pcrs); err != nil {
			t.Fatal(err)
		}
		_, err := attest.ReplayEventLog(log, pcrs)
		requireIs(t, err, attest.ErrEventLog, "PCR 1 has no event")
	})
}

// TestSimJoin runs the verifier's side of a tpm join end to end against the
// node's TPM client, in the order the JoinService runs it.
func TestSimJoin(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)
	root := tpmtest.NewManufacturer(t, "Test TPM Root CA", nil)
	v := newVerifier(t, root, nil, time.Time{})

	// Manufacturing: an EK certificate in NV.
	ek := ekOf(t, tp, tpm.EKECCP256)
	ekPub, err := attest.EKPublic(ek.PublicArea)
	if err != nil {
		t.Fatal(err)
	}
	der := root.EKCert(t, ekPub, tpmtest.EKCertOptions{})
	tpmtest.WriteNV(t, tr, tpm.EKCertIndexECCP256, der, len(der))

	// Node: evidence for round 1.
	ak := newAK(t, tp)
	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Verifier: EK, then a challenge for the AK.
	if _, err := v.VerifyEKCertificate(certs[tpm.EKCertIndexECCP256], ekPub); err != nil {
		t.Fatal(err)
	}
	c, err := attest.NewChallenge(ek.PublicArea, ak.PublicArea(), nil)
	if err != nil {
		t.Fatal(err)
	}
	nonce := randomBytes(t, 32)

	// Node: round 2 — the answer, a quote over the nonce, the node key
	// certified over its CSR.
	answer, err := tp.ActivateCredential(ctx, ak, ek, c.CredentialBlob, c.EncryptedSecret)
	if err != nil {
		t.Fatal(err)
	}
	q, sig, pcrs := quote(t, tp, ak, nonce, tpm.BootPCRs)
	key := newNodeKey(t, tp)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-1"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256(csr)
	ca, csig, err := tp.Certify(ctx, ak, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}

	// Verifier: round 2.
	if err := c.Check(answer); err != nil {
		t.Fatal(err)
	}
	if err := attest.VerifyQuote(ak.PublicArea(), q, sig, nonce, pcrs); err != nil {
		t.Fatal(err)
	}
	if _, err := attest.ReplayEventLog(nil, pcrs); err != nil {
		t.Fatal(err)
	}
	pub, err := attest.VerifyCertify(ak.PublicArea(), ca, csig, key.PublicArea(), digest[:])
	if err != nil {
		t.Fatal(err)
	}
	req, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.(*ecdsa.PublicKey).Equal(req.PublicKey) {
		t.Fatal("the certified key is not the CSR's")
	}
	name, err := attest.AKNameHex(ak.PublicArea())
	if err != nil {
		t.Fatal(err)
	}
	if want := pki.TPMAKURNPrefix + name; !strings.HasPrefix(want, "urn:nodetrust:tpm-ak:000b") || len(name) != 68 {
		t.Fatalf("leaf URN %s", want)
	}
	if !bytes.Equal(c.AKName, ak.Name()) {
		t.Fatal("AKName differs from the TPM's name of the AK")
	}
}
