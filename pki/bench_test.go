package pki

import (
	"crypto/sha256"
	"testing"
	"time"
)

func BenchmarkIssue(b *testing.B) {
	a, _ := newAuthority(b, "")
	pub := mustKey(b).Public()
	r := LeafRequest{PublicKey: pub, NodeID: "n1", Role: "worker", Site: "ams1",
		TPMAKName: []byte{0, 0xb, 1, 2, 3}, NotBefore: testNow, NotAfter: testNow.Add(24 * time.Hour)}
	for b.Loop() {
		if _, err := a.Issuer.Issue(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpenToken(b *testing.B) {
	for _, kem := range kems {
		b.Run(kem, func(b *testing.B) {
			k, err := GenerateJoinEncryptionKey(kem)
			if err != nil {
				b.Fatal(err)
			}
			csr := sha256.Sum256([]byte("csr"))
			sealed, err := SealToken(k.Public(), csr[:], []byte("nt1_0123456789abcdef0123456789abcdef"))
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := k.OpenToken(csr[:], sealed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
