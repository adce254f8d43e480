package attest_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"testing"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// TestSwtpm runs the verifier on what a freshly provisioned swtpm produces
// over TCP: EK certificates made by swtpm_setup's local CA (with the TCG
// critical subjectAltName of TPM attributes, as manufacturers write them),
// activation, a quote of PCRs 0–7 (all zero, no measurement log) and a
// certification. It skips when swtpm is not installed (fails under CI).
func TestSwtpm(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpm(t)
	tp := sw.Open(t)
	ctx := context.Background()

	roots := x509.NewCertPool()
	roots.AddCert(sw.RootCertificate(t))
	inter := x509.NewCertPool()
	inter.AddCert(sw.IssuerCertificate(t))
	v, err := attest.New(attest.Config{Roots: roots, Intermediates: inter})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []tpm.EKKind{tpm.EKRSA2048, tpm.EKECCP384} {
		t.Run(kind.String()+" EK certificate of swtpm_setup", func(t *testing.T) {
			ek, err := tp.EK(ctx, kind)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := attest.EKPublic(ek.PublicArea)
			if err != nil {
				t.Fatal(err)
			}
			der := certs[kind.CertIndex()]
			c, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			// crypto/x509 alone refuses the certificate for its critical
			// subjectAltName of TPM attributes: the case
			// VerifyEKCertificate handles.
			_, err = c.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			if !errors.As(err, new(x509.UnhandledCriticalExtension)) {
				t.Fatalf("crypto/x509 alone: %v, want an unhandled critical extension", err)
			}
			if _, err := v.VerifyEKCertificate(der, pub); err != nil {
				t.Fatal(err)
			}
		})
	}

	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	ek, err := tp.EK(ctx, tpm.EKRSA2048)
	if err != nil {
		t.Fatal(err)
	}
	c, err := attest.NewChallenge(ek.PublicArea, ak.PublicArea(), nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, err := tp.ActivateCredential(ctx, ak, ek, c.CredentialBlob, c.EncryptedSecret)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Check(answer); err != nil {
		t.Fatal(err)
	}

	nonce := randomBytes(t, 32)
	q, sig, pcrs, err := tp.Quote(ctx, ak, nonce, tpm.BootPCRs)
	if err != nil {
		t.Fatal(err)
	}
	if err := attest.VerifyQuote(ak.PublicArea(), q, sig, nonce, pcrs); err != nil {
		t.Fatal(err)
	}
	if _, err := attest.ReplayEventLog(nil, pcrs); err != nil {
		t.Fatalf("a fresh swtpm without a log: %v", err)
	}

	key, _, err := tp.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-1"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256(csr)
	a, s, err := tp.Certify(ctx, ak, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := attest.VerifyCertify(ak.PublicArea(), a, s, key.PublicArea(), digest[:]); err != nil {
		t.Fatal(err)
	}
}

// TestSwtpmEKChainInNV plays a vendor whose EK certificates are issued by
// an intermediate CA the TPM stores in its chain index (0x01C00100), at
// every index swtpm can derive the EK of: with only the vendor's root
// configured, each EK certificate is trusted through the chain the node
// read from NV, refused without it, and refused when the chain carries a
// CA of the node's own making; the EK public area of every template passes
// EKPublic and activates a credential made for it.
func TestSwtpmEKChainInNV(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpm(t)
	tp, tr := sw.OpenRaw(t)
	ctx := context.Background()

	root := tpmtest.NewManufacturer(t, "Vendor Root", nil)
	inter := tpmtest.NewManufacturer(t, "Vendor EK Issuing CA", root)
	kinds := []tpm.EKKind{tpm.EKECCP256, tpm.EKRSA2048High, tpm.EKECCP256High, tpm.EKRSA3072, tpm.EKECCP521}
	for _, k := range kinds {
		inter.Provision(t, tp, tr, k)
	}
	tpmtest.WriteNV(t, tr, tpm.EKChainIndexFirst, inter.Cert.Raw, len(inter.Cert.Raw)+64)

	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := tpm.SplitEKChain(certs)
	if err != nil {
		t.Fatal(err)
	}
	v, err := attest.New(attest.Config{Roots: root.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	rogue := tpmtest.NewManufacturer(t, "Vendor EK Issuing CA", nil) // same name, own key
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			ek, err := tp.EK(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := attest.EKPublic(ek.PublicArea)
			if err != nil {
				t.Fatalf("EKPublic: %v", err)
			}
			der := certs[k.CertIndex()]
			if _, err := v.VerifyEKCertificateChain(der, chain, pub); err != nil {
				t.Fatalf("through the chain in NV: %v", err)
			}
			if _, err := v.VerifyEKCertificate(der, pub); !errors.Is(err, attest.ErrUntrustedEK) {
				t.Fatalf("without the chain: %v, want ErrUntrustedEK", err)
			}
			if _, err := v.VerifyEKCertificateChain(der, [][]byte{rogue.Cert.Raw}, pub); !errors.Is(err, attest.ErrUntrustedEK) {
				t.Fatalf("through a CA of the node's making: %v, want ErrUntrustedEK", err)
			}
			ch, err := attest.NewChallenge(ek.PublicArea, ak.PublicArea(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			secret, err := tp.ActivateCredential(ctx, ak, ek, ch.CredentialBlob, ch.EncryptedSecret)
			if err != nil {
				t.Fatal(err)
			}
			if err := ch.Check(secret); err != nil {
				t.Fatal(err)
			}
		})
	}
}
