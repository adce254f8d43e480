package pki

import (
	"bytes"
	"crypto/ecdh"
	"crypto/sha256"
	"encoding/pem"
	"testing"
)

var kems = []string{KEMP256, KEMMLKEM768P256}

func TestTokenRoundTrip(t *testing.T) {
	for _, kem := range kems {
		t.Run("a token sealed to a "+kem+" key opens for its CSR", func(t *testing.T) {
			k, err := GenerateJoinEncryptionKey(kem)
			if err != nil {
				t.Fatal(err)
			}
			if k.KEM() != kem || k.Public().KEM() != kem {
				t.Errorf("KEM() = %q, %q; want %q", k.KEM(), k.Public().KEM(), kem)
			}
			csr := sha256.Sum256([]byte("csr"))
			token := []byte("nt1_secret-token")
			sealed, err := SealToken(k.Public(), csr[:], token)
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.OpenToken(csr[:], sealed)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, token) {
				t.Errorf("opened %q, want %q", got, token)
			}
		})
	}
}

func TestOpenTokenRefuses(t *testing.T) {
	for _, kem := range kems {
		k, err := GenerateJoinEncryptionKey(kem)
		if err != nil {
			t.Fatal(err)
		}
		other, err := GenerateJoinEncryptionKey(kem)
		if err != nil {
			t.Fatal(err)
		}
		csr := sha256.Sum256([]byte("csr"))
		otherCSR := sha256.Sum256([]byte("another csr"))
		sealed, err := SealToken(k.Public(), csr[:], []byte("token"))
		if err != nil {
			t.Fatal(err)
		}
		flipped := bytes.Clone(sealed)
		flipped[len(flipped)-1] ^= 1
		tests := []struct {
			name    string
			key     *JoinEncryptionKey
			csr     []byte
			sealed  []byte
			wantErr error
			want    string
		}{
			{"a token for another CSR does not open", k, otherCSR[:], sealed, ErrOpen, "open join token"},
			{"a token for another key does not open", other, csr[:], sealed, ErrOpen, "open join token"},
			{"an altered token does not open", k, csr[:], flipped, ErrOpen, "open join token"},
			{"a truncated token does not open", k, csr[:], sealed[:20], ErrOpen, "open join token"},
			{"nothing does not open", k, csr[:], nil, ErrOpen, "open join token"},
			{"a CSR hash of the wrong length is refused", k, csr[:31], sealed, nil, "CSR hash is 31 bytes"},
		}
		for _, tt := range tests {
			t.Run(kem+": "+tt.name, func(t *testing.T) {
				_, err := tt.key.OpenToken(tt.csr, tt.sealed)
				wantErr(t, err, tt.wantErr, tt.want)
			})
		}
	}
}

func TestSealTokenRefuses(t *testing.T) {
	k, err := GenerateJoinEncryptionKey("")
	if err != nil {
		t.Fatal(err)
	}
	csr := sha256.Sum256([]byte("csr"))
	tests := []struct {
		name, want string
		pub        *JoinEncryptionPublicKey
		csr, token []byte
	}{
		{"a short CSR hash is refused", "CSR hash is 16 bytes", k.Public(), csr[:16], []byte("t")},
		{"an empty token is refused", "token is empty", k.Public(), csr[:], nil},
		{"no key is refused", "no join encryption key", nil, csr[:], []byte("t")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := SealToken(tt.pub, tt.csr, tt.token)
			wantErr(t, err, nil, tt.want)
		})
	}
}

func TestGenerateJoinEncryptionKeyRefusesUnknownKEM(t *testing.T) {
	_, err := GenerateJoinEncryptionKey("x25519")
	wantErr(t, err, nil, `unknown join encryption KEM "x25519"`)
}

func TestJoinEncryptionKeyPEMRoundTrip(t *testing.T) {
	for _, kem := range kems {
		t.Run("a "+kem+" key survives PEM", func(t *testing.T) {
			k, err := GenerateJoinEncryptionKey(kem)
			if err != nil {
				t.Fatal(err)
			}
			b, err := k.MarshalPEM()
			if err != nil {
				t.Fatal(err)
			}
			block, _ := pem.Decode(b)
			if block == nil || block.Type != "NODETRUST HPKE PRIVATE KEY" || block.Headers["KEM"] != kem {
				t.Fatalf("PEM block = %+v", block)
			}
			back, err := ParseJoinEncryptionKeyPEM(b)
			if err != nil {
				t.Fatal(err)
			}
			if !back.Public().Equal(k.Public()) {
				t.Error("parsed key has another public key")
			}
			csr := sha256.Sum256([]byte("csr"))
			sealed, err := SealToken(k.Public(), csr[:], []byte("token"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := back.OpenToken(csr[:], sealed); err != nil {
				t.Errorf("parsed key does not open: %v", err)
			}
		})
	}
}

func TestParseJoinEncryptionKeyPEMRefuses(t *testing.T) {
	k, err := GenerateJoinEncryptionKey("")
	if err != nil {
		t.Fatal(err)
	}
	good, err := k.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(good)
	with := func(typ string, headers map[string]string, b []byte) []byte {
		return pem.EncodeToMemory(&pem.Block{Type: typ, Headers: headers, Bytes: b})
	}
	tests := []struct {
		name, want string
		in         []byte
	}{
		{"no PEM is refused", "no PEM block", []byte("x")},
		{"a PKCS#8 block is refused", `"PRIVATE KEY"`, with("PRIVATE KEY", nil, block.Bytes)},
		{"a missing KEM header is refused", "no KEM header", with(block.Type, nil, block.Bytes)},
		{"an unknown KEM is refused", `unknown join encryption KEM "x25519"`, with(block.Type, map[string]string{"KEM": "x25519"}, block.Bytes)},
		{"a short key is refused", "p256", with(block.Type, block.Headers, block.Bytes[:31])},
		{"a hybrid seed of the wrong length is refused", "mlkem768-p256", with(block.Type, map[string]string{"KEM": KEMMLKEM768P256}, block.Bytes[:31])},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseJoinEncryptionKeyPEM(tt.in)
			wantErr(t, err, nil, tt.want)
		})
	}
}

func TestJoinEncryptionPin(t *testing.T) {
	t.Run("a p256 pin is the pin of the ECDH key's SPKI", func(t *testing.T) {
		k, err := GenerateJoinEncryptionKey(KEMP256)
		if err != nil {
			t.Fatal(err)
		}
		ek, err := ecdh.P256().NewPublicKey(k.Public().Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if got, want := k.Public().Pin(), mustPinOf(t, ek); got != want {
			t.Errorf("Pin = %s, want %s", got, want)
		}
	})
	t.Run("a hybrid pin hashes the label, a zero byte and the key", func(t *testing.T) {
		k, err := GenerateJoinEncryptionKey(KEMMLKEM768P256)
		if err != nil {
			t.Fatal(err)
		}
		pub := k.Public().Bytes()
		if len(pub) != 1249 {
			t.Fatalf("public key is %d bytes, want 1249", len(pub))
		}
		want := Pin(sha256.Sum256(append([]byte("nodetrust hpke-kem 0x0050\x00"), pub...)))
		if got := k.Public().Pin(); got != want {
			t.Errorf("Pin = %s, want %s", got, want)
		}
	})
}
