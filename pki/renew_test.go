package pki

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"testing"
)

func TestRenewProofDigest(t *testing.T) {
	csr := sha256.Sum256([]byte("csr"))
	const ts = int64(1_770_000_000_123_456_789)
	data := append([]byte("nodetrust renew-pop v1\x00"), csr[:]...)
	data = binary.BigEndian.AppendUint64(data, uint64(ts))
	want := sha256.Sum256(data)
	if got := RenewProofDigest(csr[:], ts); !bytes.Equal(got, want[:]) {
		t.Errorf("digest = %x, want %x", got, want)
	}
}

func TestRenewProof(t *testing.T) {
	key := mustKey(t)
	csr := sha256.Sum256([]byte("csr"))
	const ts = int64(1_770_000_000_000_000_000)
	sig, err := SignRenewProof(key, csr[:], ts)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyRenewProof(key.Public(), csr[:], ts, sig); err != nil {
		t.Fatalf("VerifyRenewProof: %v", err)
	}

	otherCSR := sha256.Sum256([]byte("another csr"))
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Clone(sig)
	tampered[0] ^= 1
	tests := []struct {
		name string
		pub  any
		csr  []byte
		ts   int64
		sig  []byte
		want string
	}{
		{"a proof for another CSR is refused", key.Public(), otherCSR[:], ts, sig, "does not verify"},
		{"a proof for another time is refused", key.Public(), csr[:], ts + 1, sig, "does not verify"},
		{"a proof by another key is refused", mustKey(t).Public(), csr[:], ts, sig, "does not verify"},
		{"a tampered proof is refused", key.Public(), csr[:], ts, tampered, "does not verify"},
		{"an empty proof is refused", key.Public(), csr[:], ts, nil, "does not verify"},
		{"a short CSR hash is refused", key.Public(), csr[:8], ts, sig, "CSR hash is 8 bytes"},
		{"an Ed25519 key is refused", edPub, csr[:], ts, sig, "want ECDSA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, VerifyRenewProof(tt.pub, tt.csr, tt.ts, tt.sig), ErrRenewProof, tt.want)
		})
	}
	t.Run("signing refuses a short CSR hash", func(t *testing.T) {
		_, err := SignRenewProof(key, csr[:31], ts)
		wantErr(t, err, nil, "CSR hash is 31 bytes")
	})
}
