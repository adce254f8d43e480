package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"testing"
	"time"
)

// BenchmarkIssue times Issue, which parses the certificate it signed, and
// IssueLeaf, which does not (the server's join and renewal).
func BenchmarkIssue(b *testing.B) {
	a, _ := newAuthority(b, "")
	pub := mustKey(b).Public()
	r := LeafRequest{PublicKey: pub, NodeID: "n1", Role: "worker", Site: "ams1",
		TPMAKName: []byte{0, 0xb, 1, 2, 3}, NotBefore: testNow, NotAfter: testNow.Add(24 * time.Hour)}
	b.Run("parsed", func(b *testing.B) {
		for b.Loop() {
			if _, err := a.Issuer.Issue(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("leaf", func(b *testing.B) {
		for b.Loop() {
			if _, err := a.Issuer.IssueLeaf(r); err != nil {
				b.Fatal(err)
			}
		}
	})
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

// BenchmarkIssuePaired times Issue and, in alternation call by call, what
// Issue did before issue 20 — x509.CreateCertificate of the same template,
// which verifies the signature it makes, then parsing it — and reports the ratio of their
// CPU times (new / old), steadier on a shared machine than two runs.
func BenchmarkIssuePaired(b *testing.B) {
	a, _ := newAuthority(b, "")
	pub := mustKey(b).Public()
	r := LeafRequest{PublicKey: pub, NodeID: "n1", Role: "worker", Site: "ams1",
		TPMAKName: []byte{0, 0xb, 1, 2, 3}, NotBefore: testNow, NotAfter: testNow.Add(24 * time.Hour)}
	ref, err := a.Issuer.Issue(r)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := templateOf(ref)
	var newNs, oldNs time.Duration
	issue := func() {
		if _, err := a.Issuer.Issue(r); err != nil {
			b.Fatal(err)
		}
	}
	create := func() {
		der, err := x509.CreateCertificate(rand.Reader, tmpl, a.NodeCA, pub, a.Issuer.key)
		if err == nil {
			_, err = x509.ParseCertificate(der)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; b.Loop(); i++ {
		first, second, firstNs, secondNs := issue, create, &newNs, &oldNs
		if i%2 == 1 {
			first, second, firstNs, secondNs = create, issue, &oldNs, &newNs
		}
		t0 := time.Now()
		first()
		t1 := time.Now()
		second()
		*firstNs += t1.Sub(t0)
		*secondNs += time.Since(t1)
	}
	b.ReportMetric(float64(newNs)/float64(b.N), "issue-ns/op")
	b.ReportMetric(float64(oldNs)/float64(b.N), "createcert-ns/op")
	b.ReportMetric(float64(newNs)/float64(oldNs), "new/old")
}
