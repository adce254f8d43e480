package tpm_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// TestSwtpmEKCertificates reads the EK certificates swtpm_setup wrote (RSA
// 2048 and ECC P-384, no P-256), checks they are signed by the local CA and
// certify the EKs the package derives with the TCG templates.
func TestSwtpmEKCertificates(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpm(t)
	tp := sw.Open(t)
	ctx := context.Background()

	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := certs[tpm.EKCertIndexECCP256]; ok {
		t.Error("swtpm_setup wrote a P-256 EK certificate; COMPONENTS.md says it does not")
	}
	issuer := sw.IssuerCertificate(t)
	for _, kind := range []tpm.EKKind{tpm.EKRSA2048, tpm.EKECCP384} {
		t.Run(kind.String(), func(t *testing.T) {
			der, ok := certs[kind.CertIndex()]
			if !ok {
				t.Fatalf("no EK certificate at %#x", kind.CertIndex())
			}
			cert, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatalf("parse the EK certificate: %v", err)
			}
			if err := cert.CheckSignatureFrom(issuer); err != nil {
				t.Fatalf("the EK certificate is not signed by the local CA: %v", err)
			}
			ek, err := tp.EK(ctx, kind)
			if err != nil {
				t.Fatal(err)
			}
			if !ek.Public.(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) {
				t.Fatal("the EK derived with the TCG template is not the certificate's key")
			}
		})
	}
	ek, err := tp.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	if ek.Kind != tpm.EKRSA2048 {
		t.Fatalf("EKAuto chose %s, want RSA 2048", ek.Kind)
	}
}

// TestSwtpmOverTCP derives, signs, certifies, quotes and activates over TCP,
// and derives the same key after a new connection and after a restart of
// swtpm (a reboot).
func TestSwtpmOverTCP(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpm(t)
	ctx := context.Background()
	tp, err := tpm.Open(sw.Spec())
	if err != nil {
		t.Fatal(err)
	}

	key, rec, err := tp.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkSigner(t, key)
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkCertify(t, tp, ak, key)
	pcrs := checkQuote(t, tp, ak)
	for i, v := range pcrs {
		if !bytes.Equal(v, make([]byte, 32)) {
			t.Errorf("PCR %d of a fresh swtpm is %x, want zeros", i, v)
		}
	}
	checkQuoteWithTPM2Tools(t, tp, ak)
	for _, kind := range []tpm.EKKind{tpm.EKRSA2048, tpm.EKECCP384} {
		ek, err := tp.EK(ctx, kind)
		if err != nil {
			t.Fatal(err)
		}
		checkActivation(t, tp, ak, ek)
	}
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	if objects, sessions := sw.Handles(t); objects != 0 || sessions != 0 {
		t.Fatalf("%d transient objects and %d sessions left after Close, want none", objects, sessions)
	}

	loadAgain := func(t *testing.T) {
		tp := sw.Open(t)
		again, err := tp.LoadNodeKey(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		if !key.Public().(*ecdsa.PublicKey).Equal(again.Public()) {
			t.Fatal("the record derived another key")
		}
		checkSigner(t, again)
		if err := tp.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("a new connection derives the same key", loadAgain)
	t.Run("a restarted swtpm derives the same key", func(t *testing.T) {
		sw.Restart(t)
		loadAgain(t)
	})
	t.Run("another swtpm derives another key", func(t *testing.T) {
		other := tpmtest.StartSwtpm(t)
		tp := other.Open(t)
		if _, err := tp.LoadNodeKey(ctx, rec); !errors.Is(err, tpm.ErrKeyChanged) {
			t.Fatalf("LoadNodeKey on another TPM: %v, want ErrKeyChanged", err)
		}
	})
}

// checkQuoteWithTPM2Tools has tpm2_checkquote, an implementation independent
// of go-tpm, verify a quote's signature and nonce.
func checkQuoteWithTPM2Tools(t *testing.T, tp *tpm.TPM, ak *tpm.AK) {
	t.Helper()
	nonce := randomBytes(t, 16)
	quoted, sig, _, err := tp.Quote(context.Background(), ak, nonce, tpm.BootPCRs)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spki, err := x509.MarshalPKIXPublicKey(ak.Public())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"ak.pem":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}),
		"quoted.bin": quoted,
		"sig.bin":    sig,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run := func(nonceHex string) error {
		cmd := exec.Command("tpm2_checkquote",
			"-u", filepath.Join(dir, "ak.pem"),
			"-m", filepath.Join(dir, "quoted.bin"),
			"-s", filepath.Join(dir, "sig.bin"),
			"-g", "sha256",
			"-q", nonceHex)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return errors.New(string(out))
		}
		return nil
	}
	if err := run(hex.EncodeToString(nonce)); err != nil {
		t.Fatalf("tpm2_checkquote refuses the quote: %v", err)
	}
	other := sha256.Sum256(nonce)
	if err := run(hex.EncodeToString(other[:16])); err == nil {
		t.Fatal("tpm2_checkquote accepts the quote with another nonce")
	}
}

// TestSwtpmFlushLoop runs 50 rounds of every operation, a failing one
// included, on one swtpm connection. swtpm has no resource manager and room
// for 3 transient objects: one leaked object or session per round would
// fail the loop within a few rounds with "out of memory for object
// contexts".
func TestSwtpmFlushLoop(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpm(t)
	ctx := context.Background()
	tp, err := tpm.Open(sw.Spec())
	if err != nil {
		t.Fatal(err)
	}
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Every EK kind: the low-range ones through a policy session, the
	// high-range P-384 one with its authValue.
	var eks []*tpm.EK
	for _, kind := range []tpm.EKKind{tpm.EKRSA2048, tpm.EKECCP256, tpm.EKECCP384} {
		ek, err := tp.EK(ctx, kind)
		if err != nil {
			t.Fatal(err)
		}
		eks = append(eks, ek)
	}
	start := time.Now()
	const rounds = 50
	for i := range rounds {
		key, _, err := tp.NewNodeKey(ctx)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		digest := sha256.Sum256([]byte{byte(i)})
		sig, err := key.Sign(nil, digest[:], crypto.SHA256)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if !ecdsa.VerifyASN1(key.Public().(*ecdsa.PublicKey), digest[:], sig) {
			t.Fatalf("round %d: signature does not verify", i)
		}
		if _, _, err := tp.Certify(ctx, ak, key, digest[:]); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if _, _, _, err := tp.Quote(ctx, ak, digest[:], tpm.BootPCRs); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		ek := eks[i%len(eks)]
		checkActivation(t, tp, ak, ek)
		if _, err := tp.ActivateCredential(ctx, ak, ek, []byte{1, 2}, []byte{3, 4}); err == nil {
			t.Fatalf("round %d: ActivateCredential of garbage succeeded", i)
		}
		if _, err := tp.EKCertificates(ctx); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if err := key.Close(); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	t.Logf("%d rounds in %v", rounds, time.Since(start))
	if err := ak.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	if objects, sessions := sw.Handles(t); objects != 0 || sessions != 0 {
		t.Fatalf("%d transient objects and %d sessions left, want none", objects, sessions)
	}
}

// TestSwtpmEKCertificateEveryIndex plays a manufacturer that certifies the
// EK of every template swtpm derives, each at its NV index, under an
// intermediate CA it stores in the chain indices (one certificate at
// 0x01C00100, padded, and the intermediate's issuer again at 0x01C00101):
// each certificate is read back at its index and certifies the key EK
// derives for its kind, the chain splits into the stored certificates, and
// a credential made for each EK activates.
func TestSwtpmEKCertificateEveryIndex(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpm(t)
	tp, tr := sw.OpenRaw(t)
	ctx := context.Background()

	root := tpmtest.NewManufacturer(t, "Vendor Root", nil)
	inter := tpmtest.NewManufacturer(t, "Vendor EK Intermediate", root)
	// RSA 2048 (L-1) and ECC P-384 (H-3) are swtpm_setup's; the others are
	// provisioned here. Neither swtpm 0.7 nor the simulator derives RSA
	// 4096 (H-7): TPM_RC_VALUE.
	added := []tpm.EKKind{tpm.EKECCP256, tpm.EKRSA2048High, tpm.EKECCP256High, tpm.EKRSA3072, tpm.EKECCP521}
	want := map[uint32]*tpm.EK{}
	for _, kind := range added {
		want[kind.CertIndex()] = nil
		inter.Provision(t, tp, tr, kind)
	}
	tpmtest.WriteNV(t, tr, tpm.EKChainIndexFirst, inter.Cert.Raw, len(inter.Cert.Raw)+100)
	tpmtest.WriteNV(t, tr, tpm.EKChainIndexFirst+1, root.Cert.Raw, 0)

	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range append([]tpm.EKKind{tpm.EKRSA2048, tpm.EKECCP384}, added...) {
		der, ok := certs[kind.CertIndex()]
		if !ok {
			t.Errorf("%s: no certificate read at %#x", kind, kind.CertIndex())
			continue
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Errorf("%s: %v", kind, err)
			continue
		}
		ek, err := tp.EK(ctx, kind)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if !ek.Public.(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) {
			t.Errorf("%s: the certificate at %#x certifies another key than the EK of its template", kind, kind.CertIndex())
		}
		if kind != tpm.EKRSA2048 && kind != tpm.EKECCP384 {
			if err := cert.CheckSignatureFrom(inter.Cert); err != nil {
				t.Errorf("%s: %v", kind, err)
			}
		}
	}
	chain, err := tpm.SplitEKChain(certs)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || !bytes.Equal(chain[0], inter.Cert.Raw) || !bytes.Equal(chain[1], root.Cert.Raw) {
		t.Fatalf("the chain read back is %d certificates, want the intermediate then the root", len(chain))
	}
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	for _, kind := range []tpm.EKKind{tpm.EKRSA2048High, tpm.EKECCP256High, tpm.EKRSA3072, tpm.EKECCP521} {
		ek, err := tp.EK(ctx, kind)
		if err != nil {
			t.Fatal(err)
		}
		checkActivation(t, tp, ak, ek)
	}
	if objects, sessions, err := tpmtest.LoadedHandles(tr); err != nil || objects != 1 || sessions != 0 {
		t.Errorf("after the EK work, %d objects and %d sessions are loaded (%v), want the AK alone", objects, sessions, err)
	}
}

// TestSwtpmECCOnly removes the RSA EK certificate swtpm_setup wrote, leaving
// a TPM whose only EK certificate is ECC P-384, as a vendor that certifies
// ECC alone ships it: EKAuto picks the ECC EK its certificate certifies.
// Then the P-384 certificate goes too and a P-256 one (low range) comes in
// its place: EKAuto follows it.
func TestSwtpmECCOnly(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpm(t)
	tp, tr := sw.OpenRaw(t)
	ctx := context.Background()
	tpmtest.UndefineNV(t, tr, tpm.EKCertIndexRSA2048)

	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 1 || certs[tpm.EKCertIndexECCP384] == nil {
		t.Fatalf("EK certificates at %v, want P-384's alone", keys(certs))
	}
	ek, err := tp.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	if ek.Kind != tpm.EKECCP384 {
		t.Fatalf("EKAuto chose %s on a TPM certified for ECC P-384 alone", ek.Kind)
	}

	tpmtest.UndefineNV(t, tr, tpm.EKCertIndexECCP384)
	m := tpmtest.NewManufacturer(t, "ECC Vendor", nil)
	m.Provision(t, tp, tr, tpm.EKECCP256)
	if ek, err = tp.EK(ctx, tpm.EKAuto); err != nil {
		t.Fatal(err)
	}
	if ek.Kind != tpm.EKECCP256 {
		t.Fatalf("EKAuto chose %s on a TPM certified for ECC P-256 alone", ek.Kind)
	}
}

// TestSwtpmRSA3072 starts a swtpm that swtpm_setup provisioned with an RSA
// 3072 EK (its certificate at 0x01C0001C, template H-6): the certificate
// swtpm's own tools made certifies the key this package derives with H-6,
// which checks the template against an independent implementation. EKAuto
// prefers the P-384 EK swtpm_setup also certified (EKKinds' order).
func TestSwtpmRSA3072(t *testing.T) {
	t.Parallel()
	sw := tpmtest.StartSwtpmRSA3072(t)
	tp := sw.Open(t)
	ctx := context.Background()
	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := certs[tpm.EKCertIndexRSA2048]; ok {
		t.Fatal("swtpm_setup --rsa-keysize 3072 also wrote an RSA 2048 EK certificate")
	}
	der, ok := certs[tpm.EKCertIndexRSA3072]
	if !ok {
		t.Fatalf("no EK certificate at %#x; indices: %v", tpm.EKCertIndexRSA3072, keys(certs))
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.CheckSignatureFrom(sw.IssuerCertificate(t)); err != nil {
		t.Fatal(err)
	}
	auto, err := tp.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	if auto.Kind != tpm.EKECCP384 {
		t.Fatalf("EKAuto chose %s, want ECC P-384 (before RSA 3072 in EKKinds)", auto.Kind)
	}
	ek, err := tp.EK(ctx, tpm.EKRSA3072)
	if err != nil {
		t.Fatal(err)
	}
	if !ek.Public.(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) {
		t.Fatal("the EK derived with template H-6 is not the key swtpm_setup certified")
	}
}

func keys(m map[uint32][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, fmt.Sprintf("%#x", k))
	}
	return out
}
