package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/pki/pkitest"
)

const trustDomain = "nodetrust.test"

// keyPEM encodes k as PKCS#8 in a PEM block of type typ.
func keyPEM(t testing.TB, k crypto.PrivateKey, typ string) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func fileKeyPEM(t testing.TB, k crypto.PrivateKey) []byte { return keyPEM(t, k, PEMTypeFileKey) }

// testCA is a node-issuing CA for tests.
type testCA struct{ *pkitest.CA }

func newCA(t testing.TB) testCA { return testCA{pkitest.NewCA(t, "test node CA")} }

// leafTemplate is a node certificate for nodeID.
func leafTemplate(nodeID string) *x509.Certificate {
	u := &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/node/" + nodeID}
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: nodeID},
		NotBefore:   time.Now().Add(-time.Minute),
		NotAfter:    time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:        []*url.URL{u},
	}
}

// identity returns an identity for nodeID whose leaf the CA issued for pub.
func (ca testCA) identity(t testing.TB, nodeID string, pub crypto.PublicKey) Identity {
	t.Helper()
	der := ca.Issue(t, leafTemplate(nodeID), pub).Raw
	return Identity{
		Version:     Version,
		NodeID:      nodeID,
		SPIFFEID:    "spiffe://" + trustDomain + "/node/" + nodeID,
		TrustDomain: trustDomain,
		Role:        "worker",
		Site:        "lab",
		Generation:  1,
		Attestor:    "token",
		KeyKind:     KeyKindFile,
		Chain:       [][]byte{der, ca.Cert.Raw},
		Roots:       [][]byte{ca.Cert.Raw},
		ServerTime:  time.Now().UTC().Truncate(time.Second),
		JoinedAt:    time.Now().UTC().Truncate(time.Second),
	}
}

// selfSignedIdentity returns an identity whose leaf is self-signed by key.
func selfSignedIdentity(t testing.TB, nodeID string, key *ecdsa.PrivateKey) Identity {
	t.Helper()
	der := pkitest.SelfSigned(t, leafTemplate(nodeID), key).Raw
	return Identity{Version: Version, NodeID: nodeID, KeyKind: KeyKindFile, Chain: [][]byte{der}, Roots: [][]byte{der}}
}

func writeFile(t testing.TB, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeIdentity(t testing.TB, dir string, id Identity) {
	t.Helper()
	data, err := marshal(id)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, datadir.IdentityFile, data)
}

func readFile(t testing.TB, dir, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func exists(t testing.TB, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// closingSigner records that LoadState closed it.
type closingSigner struct {
	*ecdsa.PrivateKey
	closed *bool
}

func (c closingSigner) Close() error { *c.closed = true; return nil }

// tpmLoader stands in for a TPM key loader: a PEMTypeTPMKey block here holds
// a PKCS#8 key (a real record holds no secret). File keys load as usual.
// Every signer it returns for a TPM record reports its Close into closed.
func tpmLoader(closed *bool) KeyLoader {
	return func(pemBytes []byte) (crypto.Signer, error) {
		block, _ := pem.Decode(pemBytes)
		if block == nil || block.Type != PEMTypeTPMKey {
			return LoadPKCS8Key(pemBytes)
		}
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, errors.Join(ErrInvalidKey, err)
		}
		return closingSigner{PrivateKey: k.(*ecdsa.PrivateKey), closed: closed}, nil
	}
}

func ed25519Key(t testing.TB) crypto.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func p384Key(t testing.TB) crypto.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
