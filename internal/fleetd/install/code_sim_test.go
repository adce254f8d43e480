//go:build tpmsim

package install_test

import (
	"bytes"
	"sync"
	"testing"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmsim"
)

// A code wrapped to one TPM's EK and AK name is unwrapped by that TPM with
// that AK, and by nothing else: not another AK of the same TPM, not
// another TPM.
func TestWrappedCodeUnwrapsOnlyInItsTPM(t *testing.T) {
	for _, kind := range []tpm.EKKind{tpm.EKRSA2048, tpm.EKECCP256} {
		t.Run(kind.String(), func(t *testing.T) {
			code, err := install.NewCode(nil)
			if err != nil {
				t.Fatal(err)
			}
			var wrapped install.Wrapped
			func() {
				tp, closeSim := openSim(t)
				// Closed before the second TPM opens, after the AKs.
				defer closeSim()
				ctx := t.Context()
				ek, err := tp.EK(ctx, kind)
				if err != nil {
					t.Fatal(err)
				}
				ak, _, err := tp.NewAK(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer ak.Close()
				name, err := attest.AKName(ak.PublicArea())
				if err != nil {
					t.Fatal(err)
				}
				wrapped, err = install.WrapCode(ek.PublicArea, name, code)
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Contains(wrapped.CredentialBlob, code[:]) || bytes.Contains(wrapped.EncryptedSecret, code[:]) {
					t.Fatal("the wrapped code carries the code in the clear")
				}
				secret, err := tp.ActivateCredential(ctx, ak, ek, wrapped.CredentialBlob, wrapped.EncryptedSecret)
				if err != nil {
					t.Fatalf("ActivateCredential in the TPM the code was wrapped to: %v", err)
				}
				got, err := install.CodeFromSecret(secret)
				if err != nil || got != code {
					t.Fatalf("unwrapped code differs (%v)", err)
				}
				// Another AK of the same TPM is not the one named.
				other, _, err := tp.NewAK(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer other.Close()
				if _, err := tp.ActivateCredential(ctx, other, ek, wrapped.CredentialBlob, wrapped.EncryptedSecret); err == nil {
					t.Fatal("another AK of the same TPM unwrapped the code")
				}
			}()
			// A second simulator is a new TPM: new seeds, another EK.
			tp, _ := openSim(t)
			ctx := t.Context()
			ek, err := tp.EK(ctx, kind)
			if err != nil {
				t.Fatal(err)
			}
			ak, _, err := tp.NewAK(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer ak.Close()
			if _, err := tp.ActivateCredential(ctx, ak, ek, wrapped.CredentialBlob, wrapped.EncryptedSecret); err == nil {
				t.Fatal("another TPM unwrapped the code")
			}
		})
	}
}

// openSim opens the simulator and returns it with its close, which the
// test may call early so that the next openSim gets a new TPM (the
// simulator is one per process; each open manufactures a fresh one).
func openSim(t *testing.T) (*tpm.TPM, func()) {
	t.Helper()
	tp, err := tpmsim.Open()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeSim := func() {
		once.Do(func() {
			if err := tp.Close(); err != nil {
				t.Errorf("close the simulator: %v", err)
			}
		})
	}
	t.Cleanup(closeSim)
	return tp, closeSim
}
