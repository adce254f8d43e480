package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
)

func csrFor(t *testing.T, tmpl x509.CertificateRequest, usages ...certificatesv1.KeyUsage) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	if usages == nil {
		usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	}
	return &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
		Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		SignerName: KubeletClientSigner,
		Usages:     usages,
	}}
}

func TestKubeletClientNode(t *testing.T) {
	subject := pkix.Name{CommonName: "system:node:node-a", Organization: []string{"system:nodes"}}
	node, err := kubeletClientNode(csrFor(t, x509.CertificateRequest{Subject: subject}))
	if err != nil || node != "node-a" {
		t.Fatalf("a well-formed request: %q, %v; want node-a", node, err)
	}

	tampered := csrFor(t, x509.CertificateRequest{Subject: subject})
	block, _ := pem.Decode(tampered.Spec.Request)
	block.Bytes[len(block.Bytes)-3] ^= 0xff // in the signature
	tampered.Spec.Request = pem.EncodeToMemory(block)

	for name, c := range map[string]struct {
		csr  *certificatesv1.CertificateSigningRequest
		want string
	}{
		"not PEM":        {&certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{Request: []byte("x")}}, "not a PEM"},
		"bad signature":  {tampered, "signature"},
		"not a node":     {csrFor(t, x509.CertificateRequest{Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:nodes"}}}), "common name"},
		"empty node":     {csrFor(t, x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:", Organization: []string{"system:nodes"}}}), "common name"},
		"masters too":    {csrFor(t, x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:node-a", Organization: []string{"system:nodes", "system:masters"}}}), "organisations"},
		"a DNS name":     {csrFor(t, x509.CertificateRequest{Subject: subject, DNSNames: []string{"node-a"}}), "alternative names"},
		"an IP":          {csrFor(t, x509.CertificateRequest{Subject: subject, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}}), "alternative names"},
		"server auth":    {csrFor(t, x509.CertificateRequest{Subject: subject}, certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth), "usage"},
		"no client auth": {csrFor(t, x509.CertificateRequest{Subject: subject}, certificatesv1.UsageDigitalSignature), "client authentication"},
	} {
		if _, err := kubeletClientNode(c.csr); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %q", name, err, c.want)
		}
	}
}
