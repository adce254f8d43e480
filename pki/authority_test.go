package pki

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"os"
	"strings"
	"testing"
)

func TestLoadAuthority(t *testing.T) {
	for _, kem := range kems {
		t.Run("an authority with a "+kem+" join key loads and works", func(t *testing.T) {
			a, _ := newAuthority(t, kem)
			if a.TrustDomain != testTD || a.Issuer.TrustDomain() != testTD {
				t.Errorf("trust domain %q, issuer %q", a.TrustDomain, a.Issuer.TrustDomain())
			}
			if a.JoinEncryption.KEM() != kem {
				t.Errorf("KEM = %q, want %q", a.JoinEncryption.KEM(), kem)
			}
			req := newNodeRequest(t)
			sealed, err := SealToken(a.JoinEncryption.Public(), req.csrHash, []byte("token"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.JoinEncryption.OpenToken(req.csrHash, sealed); err != nil {
				t.Errorf("OpenToken: %v", err)
			}
			// The join signer signs, and its key is the bundle's pin.
			digest := sha256.Sum256([]byte("join result"))
			sig, err := SignP1363(a.JoinSigner, digest[:])
			if err != nil {
				t.Fatal(err)
			}
			pub, ok := a.JoinSigner.Public().(*ecdsa.PublicKey)
			if !ok || !VerifyP1363(pub, digest[:], sig) {
				t.Error("the join signer's signature does not verify under its public key")
			}
			if pin, err := PinOf(a.JoinSigner.Public()); err != nil || !pin.Equal(a.Bundle.JoinSigningKeyPin) {
				t.Errorf("join signer pin %s, bundle says %s (%v)", pin, a.Bundle.JoinSigningKeyPin, err)
			}
		})
	}
}

func TestLoadAuthorityRefusesMismatches(t *testing.T) {
	// other supplies files from another, unrelated PKI.
	_, otherDir := newAuthority(t, "")
	fromOther := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			b, err := os.ReadFile(Path(otherDir, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(Path(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	remove := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			if err := os.Remove(Path(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name    string
		breakIt func(t *testing.T, dir string)
		file    string
		want    string
	}{
		{"another join signing key is refused", fromOther(JoinSigningKeyFile), JoinSigningKeyFile, "is not join_signing_key_pin"},
		{"another join encryption key is refused", fromOther(JoinEncryptionKeyFile), JoinEncryptionKeyFile, "is not join_encryption_key_pin"},
		{"another JWK is refused", fromOther(JoinEncryptionJWKFile), JoinEncryptionJWKFile, "not the public key of join-encryption.key"},
		{"another node CA is refused", fromOther(NodeCACertFile), NodeCACertFile, "not signed by root-ca.crt"},
		{"another node CA key is refused", fromOther(NodeCAKeyFile), NodeCAKeyFile, "key does not match CA certificate"},
		{"another serving CA is refused", fromOther(ServingCACertFile), ServingCACertFile, "not signed by root-ca.crt"},
		{"another serving key is refused", fromOther(ServingKeyFile), ServingKeyFile, "key does not match serving.crt"},
		{"another serving certificate is refused", fromOther(ServingCertFile), ServingCertFile, "followed by serving-ca.crt"},
		{"another bundle is refused", fromOther(BundleFile), ServingCACertFile, "is not serving_ca_spki_pin"},
		{"a missing node CA key is named", remove(NodeCAKeyFile), NodeCAKeyFile, "are missing: no key"},
		{"another DevID CA is refused", fromOther(DevIDCACertFile), DevIDCACertFile, "not signed by root-ca.crt"},
		{"another DevID CA key is refused", fromOther(DevIDCAKeyFile), DevIDCAKeyFile, "key does not match CA certificate"},
		{"a missing bundle is named", remove(BundleFile), BundleFile, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, dir := newAuthority(t, "")
			tt.breakIt(t, dir)
			_, err := LoadAuthority(dir)
			wantErr(t, err, nil, tt.want)
			if err != nil && !strings.Contains(err.Error(), Path(dir, tt.file)) {
				t.Errorf("error %q does not name %s", err, Path(dir, tt.file))
			}
		})
	}
}

func TestLoadAuthorityDoesNotNeedOfflineKeys(t *testing.T) {
	_, dir := newAuthority(t, "")
	for _, name := range []string{RootCAKeyFile, ServingCAKeyFile, OwnerCertFile, OwnerKeyFile} {
		if err := os.Remove(Path(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadAuthority(dir); err != nil {
		t.Fatalf("LoadAuthority without offline keys: %v", err)
	}
}
