//go:build tpmsim

package tpm_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// requireHandles fails unless exactly wantObjects transient objects and no
// session are loaded.
func requireHandles(t *testing.T, tr transport.TPM, wantObjects int) {
	t.Helper()
	objects, sessions, err := tpmtest.LoadedHandles(tr)
	if err != nil {
		t.Fatal(err)
	}
	if objects != wantObjects || sessions != 0 {
		t.Fatalf("%d transient objects and %d sessions loaded, want %d and 0", objects, sessions, wantObjects)
	}
}

func TestSimNodeKeyDerivation(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)

	key, rec, err := tp.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm.CheckNodeKeyAttributes(key.PublicArea()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec.Name, key.Name()) {
		t.Fatal("the record does not name the key it made")
	}

	t.Run("the same record derives the same key", func(t *testing.T) {
		pemBytes, err := tpm.MarshalKeyRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		rec2, err := tpm.ParseKeyRecord(pemBytes)
		if err != nil {
			t.Fatal(err)
		}
		again, err := tp.LoadNodeKey(ctx, rec2)
		if err != nil {
			t.Fatal(err)
		}
		defer again.Close()
		if !key.Public().(*ecdsa.PublicKey).Equal(again.Public()) || !bytes.Equal(key.Name(), again.Name()) {
			t.Fatal("the same record derived another key")
		}
		if !bytes.Equal(key.PublicArea(), again.PublicArea()) {
			t.Fatal("the same record derived another public area")
		}
	})

	t.Run("another record derives another key", func(t *testing.T) {
		other, rec2, err := tp.NewNodeKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		if bytes.Equal(rec.Template, rec2.Template) {
			t.Fatal("two new records share a template")
		}
		if key.Public().(*ecdsa.PublicKey).Equal(other.Public()) {
			t.Fatal("two records derived the same key")
		}
	})

	t.Run("a node-key record does not load as an AK", func(t *testing.T) {
		if _, err := tp.LoadAK(ctx, rec); err == nil {
			t.Fatal("LoadAK of a node-key record succeeded")
		}
	})

	if err := key.Close(); err != nil {
		t.Fatal(err)
	}
	requireHandles(t, tr, 0)
	firstPub := key.Public().(*ecdsa.PublicKey)
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}

	// A freshly manufactured simulator has other seeds: the case of a TPM
	// whose owner hierarchy was cleared, or another TPM.
	t.Run("a fresh TPM derives another key from the same record", func(t *testing.T) {
		fresh, _ := tpmtest.OpenSim(t)
		_, err := fresh.LoadNodeKey(ctx, rec)
		if !errors.Is(err, tpm.ErrKeyChanged) {
			t.Fatalf("LoadNodeKey on a fresh TPM: %v, want ErrKeyChanged", err)
		}
		unnamed := rec
		unnamed.Name = nil
		k, err := fresh.LoadNodeKey(ctx, unnamed)
		if err != nil {
			t.Fatal(err)
		}
		if firstPub.Equal(k.Public()) {
			t.Fatal("a fresh TPM derived the same key")
		}
	})
}

func TestSimNodeKeySigns(t *testing.T) {
	tp, _ := tpmtest.OpenSim(t)
	key, _, err := tp.NewNodeKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkSigner(t, key)

	t.Run("a closed key does not sign", func(t *testing.T) {
		if err := key.Close(); err != nil {
			t.Fatal(err)
		}
		digest := sha256.Sum256([]byte("x"))
		if _, err := key.Sign(rand.Reader, digest[:], crypto.SHA256); !errors.Is(err, tpm.ErrClosed) {
			t.Fatalf("Sign after Close: %v, want ErrClosed", err)
		}
	})
}

func TestSimCertify(t *testing.T) {
	ctx := context.Background()
	tp, _ := tpmtest.OpenSim(t)
	ak, akRec, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm.CheckAKAttributes(ak.PublicArea()); err != nil {
		t.Fatal(err)
	}
	if err := tpm.CheckNodeKeyAttributes(ak.PublicArea()); err == nil {
		t.Fatal("an AK passes as a node key")
	}
	key, _, err := tp.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkCertify(t, tp, ak, key)

	t.Run("the AK record derives the same AK", func(t *testing.T) {
		again, err := tp.LoadAK(ctx, akRec)
		if err != nil {
			t.Fatal(err)
		}
		defer again.Close()
		if !bytes.Equal(again.Name(), ak.Name()) {
			t.Fatal("the AK record derived another AK")
		}
	})
}

func TestSimQuote(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := checkQuote(t, tp, ak)

	// Extend PCR 7 behind the package's back; the next quote shows it.
	m := sha256.Sum256([]byte("secure boot state"))
	if _, err := (tpm2.PCRExtend{
		PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(7), Auth: tpm2.PasswordAuth(nil)},
		Digests:   tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{{HashAlg: tpm2.TPMAlgSHA256, Digest: m[:]}}},
	}).Execute(tr); err != nil {
		t.Fatal(err)
	}
	after := checkQuote(t, tp, ak)
	want := sha256.Sum256(append(bytes.Clone(before[7]), m[:]...))
	if !bytes.Equal(after[7], want[:]) {
		t.Fatalf("PCR 7 = %x after the extend, want %x", after[7], want)
	}
	for i := range 7 {
		if !bytes.Equal(before[i], after[i]) {
			t.Fatalf("PCR %d changed", i)
		}
	}

	t.Run("refused selections", func(t *testing.T) {
		for _, pcrs := range [][]int{nil, {24}, {-1}, {1, 1}} {
			if _, _, _, err := tp.Quote(ctx, ak, []byte("n"), pcrs); err == nil {
				t.Errorf("Quote of PCRs %v succeeded", pcrs)
			}
		}
	})
}

func TestSimActivateCredential(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []tpm.EKKind{tpm.EKRSA2048, tpm.EKECCP256, tpm.EKECCP384} {
		t.Run(kind.String(), func(t *testing.T) {
			start := time.Now()
			ek, err := tp.EK(ctx, kind)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("deriving the %s EK took %v", kind, time.Since(start))
			checkActivation(t, tp, ak, ek)

			t.Run("a credential for another AK is refused", func(t *testing.T) {
				other := sha256.Sum256([]byte("another AK"))
				blob, encSecret, err := tpmtest.MakeCredential(ek.PublicArea, append([]byte{0, 0x0B}, other[:]...), []byte("secret"))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tp.ActivateCredential(ctx, ak, ek, blob, encSecret); err == nil {
					t.Fatal("ActivateCredential of a credential for another AK succeeded")
				}
			})
			t.Run("garbage is refused", func(t *testing.T) {
				if _, err := tp.ActivateCredential(ctx, ak, ek, []byte{1, 2, 3}, []byte{4, 5, 6}); err == nil {
					t.Fatal("ActivateCredential of garbage succeeded")
				}
			})
			// Only the AK stays loaded, whatever failed.
			requireHandles(t, tr, 1)
		})
	}
}

func TestSimEKCertificates(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)

	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 0 {
		t.Fatalf("a fresh simulator holds EK certificates at %v", certs)
	}
	ek, err := tp.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	if ek.Kind != tpm.EKRSA2048 {
		t.Fatalf("EKAuto without certificates chose %s, want RSA 2048", ek.Kind)
	}

	// A P-256 certificate in an index of its size: EKAuto now picks P-256.
	p256, err := tp.EK(ctx, tpm.EKECCP256)
	if err != nil {
		t.Fatal(err)
	}
	p256Cert := tpmtest.NewManufacturer(t, "test TPM manufacturer CA", nil).EKCert(t, p256.Public, tpmtest.EKCertOptions{})
	tpmtest.WriteNV(t, tr, tpm.EKCertIndexECCP256, p256Cert, len(p256Cert))
	auto, err := tp.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	if auto.Kind != tpm.EKECCP256 || !bytes.Equal(auto.Name, p256.Name) {
		t.Fatalf("EKAuto with a P-256 certificate chose %s", auto.Kind)
	}

	// An RSA certificate in an index larger than the certificate, as on
	// many TPMs, and larger than one TPM2_NV_Read: read in chunks, and the
	// padding is cut.
	rsaCert := tpmtest.NewManufacturer(t, "test TPM manufacturer CA", nil).EKCert(t, ek.Public, tpmtest.EKCertOptions{})
	tpmtest.WriteNV(t, tr, tpm.EKCertIndexRSA2048, rsaCert, 2000)

	certs, err = tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 2 {
		t.Fatalf("EKCertificates returned %d certificates, want 2", len(certs))
	}
	if !bytes.Equal(certs[tpm.EKCertIndexRSA2048], rsaCert) {
		t.Fatal("the RSA EK certificate read differs from the one written")
	}
	if !bytes.Equal(certs[tpm.EKCertIndexECCP256], p256Cert) {
		t.Fatal("the P-256 EK certificate read differs from the one written")
	}
	for idx, der := range certs {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatalf("certificate at %#x: %v", idx, err)
		}
		want := ek.Public
		if idx == tpm.EKCertIndexECCP256 {
			want = p256.Public
		}
		if !want.(interface{ Equal(crypto.PublicKey) bool }).Equal(c.PublicKey) {
			t.Fatalf("certificate at %#x certifies another key than the EK", idx)
		}
	}
	auto, err = tp.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	if auto.Kind != tpm.EKRSA2048 {
		t.Fatalf("EKAuto with RSA and P-256 certificates chose %s, want RSA 2048", auto.Kind)
	}
	requireHandles(t, tr, 0)
}

// TestSimFlushDiscipline runs every operation, failures included, many times
// and checks that only the keys still open stay loaded.
func TestSimFlushDiscipline(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := tp.EK(ctx, tpm.EKECCP256)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		key, _, err := tp.NewNodeKey(ctx)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		checkCertify(t, tp, ak, key)
		checkActivation(t, tp, ak, ek)
		if _, err := tp.ActivateCredential(ctx, ak, ek, []byte{1}, []byte{2}); err == nil {
			t.Fatal("ActivateCredential of garbage succeeded")
		}
		if err := key.Close(); err != nil {
			t.Fatal(err)
		}
	}
	requireHandles(t, tr, 1)

	t.Run("a cancelled context sends nothing and leaks nothing", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, _, err := tp.NewNodeKey(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("NewNodeKey: %v, want context.Canceled", err)
		}
		if _, err := tp.EKCertificates(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("EKCertificates: %v, want context.Canceled", err)
		}
		requireHandles(t, tr, 1)
	})

	t.Run("Close flushes the keys still loaded", func(t *testing.T) {
		// A second TPM on the same transport, without closing it.
		tp2 := tpm.New(tr, nil)
		if _, _, err := tp2.NewNodeKey(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := tp2.NewAK(ctx); err != nil {
			t.Fatal(err)
		}
		requireHandles(t, tr, 3)
		if err := tp2.Close(); err != nil {
			t.Fatal(err)
		}
		requireHandles(t, tr, 1)
		if _, _, err := tp2.NewNodeKey(ctx); !errors.Is(err, tpm.ErrClosed) {
			t.Fatalf("NewNodeKey after Close: %v, want ErrClosed", err)
		}
	})
}

func TestSimKeyFromAnotherConnection(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tp2 := tpm.New(tr, nil)
	defer tp2.Close()
	key, _, err := tp2.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	if _, _, err := tp.Certify(ctx, ak, key, nil); err == nil {
		t.Fatal("Certify of a key from another connection succeeded")
	}
}

// TestSimConcurrentUse signs, certifies and quotes from several goroutines
// at once on one TPM: the mutex serializes the commands (run with -race).
func TestSimConcurrentUse(t *testing.T) {
	ctx := context.Background()
	tp, tr := tpmtest.OpenSim(t)
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := tp.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 10 {
				digest := sha256.Sum256([]byte{byte(g), byte(i)})
				sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
				if err != nil {
					errs <- err
					return
				}
				if !ecdsa.VerifyASN1(key.Public().(*ecdsa.PublicKey), digest[:], sig) {
					errs <- errors.New("signature does not verify")
					return
				}
				if _, _, err := tp.Certify(ctx, ak, key, digest[:]); err != nil {
					errs <- err
					return
				}
				if _, _, _, err := tp.Quote(ctx, ak, digest[:], tpm.BootPCRs); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	requireHandles(t, tr, 2)
}
