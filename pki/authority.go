package pki

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Authority is the control plane's PKI as [LoadAuthority] reads it from the
// directory [Init] wrote.
type Authority struct {
	TrustDomain string
	Root        *x509.Certificate
	NodeCA      *x509.Certificate
	ServingCA   *x509.Certificate
	// DevIDCA certifies device keys (LDevIDs); it is a CA of its own
	// under the root, apart from the node CA.
	DevIDCA *x509.Certificate
	// Issuer issues node certificates under NodeCA.
	Issuer *Issuer
	// DevIDIssuer issues certificates under DevIDCA.
	DevIDIssuer *Issuer
	// ServingCert is the TLS serving certificate with its chain (the
	// serving CA) and Leaf set.
	ServingCert    tls.Certificate
	JoinSigner     crypto.Signer
	JoinEncryption *JoinEncryptionKey
	Bundle         *Bundle
	// AdminCA issues admin credentials, with AdminSigner its key; both nil
	// for a directory made before the admin CA existed (see [AddAdminCA]),
	// whose owner credential chains to the serving CA.
	AdminCA     *x509.Certificate
	AdminSigner crypto.Signer
}

// LoadAuthority reads what [Init] wrote in dir, with every key it needs in
// a file, as [LoadAuthorityWith] does without a [KeyOpener].
func LoadAuthority(dir string) (*Authority, error) {
	return LoadAuthorityWith(dir, nil)
}

// LoadAuthorityWith reads what [Init] wrote in dir and checks that it belongs
// together: the node CA, the DevID CA and the serving CA are signed by the root, the
// serving certificate by the serving CA and followed by it, each key
// matches its certificate, the JWK is the join encryption key's, and the
// bundle's three pins are those of the serving CA, the join signing key
// and the join encryption key. Every error names the file.
//
// The admin CA (admin-ca.crt, and its key as the other CAs') is read when
// present; it must be signed by the root and match its key.
//
// A key named by a reference file (<use>.keyref) rather than a key file is
// opened with open; a nil open refuses it. The keys it opens are the node
// CA's, the DevID CA's, the serving key and the join signing key.
//
// It does not read the root CA's or the serving CA's key, or the admin
// credential, which a running control plane does not need; they may be
// kept offline. It does not check validity periods: TLS and chain
// verification do.
func LoadAuthorityWith(dir string, open KeyOpener) (*Authority, error) {
	a := new(Authority)
	var err error
	fail := func(name string, err error) (*Authority, error) {
		return nil, fmt.Errorf("load pki %s: %w", Path(dir, name), err)
	}

	if a.Bundle, err = ReadBundle(Path(dir, BundleFile)); err != nil {
		return nil, fmt.Errorf("load pki: %w", err)
	}
	a.TrustDomain = a.Bundle.TrustDomain

	if a.Root, err = readOneCert(dir, RootCACertFile); err != nil {
		return nil, err
	}
	if !a.Root.IsCA {
		return fail(RootCACertFile, errors.New("not a CA certificate"))
	}
	if err := a.Root.CheckSignatureFrom(a.Root); err != nil {
		return fail(RootCACertFile, fmt.Errorf("not a self-signed root: %w", err))
	}

	if a.NodeCA, err = readOneCert(dir, NodeCACertFile); err != nil {
		return nil, err
	}
	if err := a.NodeCA.CheckSignatureFrom(a.Root); err != nil {
		return fail(NodeCACertFile, fmt.Errorf("not signed by %s: %w", RootCACertFile, err))
	}
	nodeKey, err := openKey(dir, KeyNodeCA, open)
	if err != nil {
		return nil, fmt.Errorf("load pki: %w", err)
	}
	if a.Issuer, err = NewIssuer(a.NodeCA, nodeKey, []*x509.Certificate{a.NodeCA}, a.TrustDomain); err != nil {
		return fail(NodeCAKeyFile, err)
	}

	if _, err := os.Lstat(Path(dir, DevIDCACertFile)); errors.Is(err, fs.ErrNotExist) {
		return fail(DevIDCACertFile, errors.New("missing: the PKI was made before the DevID CA; add it with fleetd init --add-devid-ca --dir "+dir+" (needs root-ca.key there)"))
	}
	if a.DevIDCA, err = readOneCert(dir, DevIDCACertFile); err != nil {
		return nil, err
	}
	if err := a.DevIDCA.CheckSignatureFrom(a.Root); err != nil {
		return fail(DevIDCACertFile, fmt.Errorf("not signed by %s: %w", RootCACertFile, err))
	}
	devIDKey, err := openKey(dir, KeyDevIDCA, open)
	if err != nil {
		return nil, fmt.Errorf("load pki: %w", err)
	}
	if a.DevIDIssuer, err = NewIssuer(a.DevIDCA, devIDKey, []*x509.Certificate{a.DevIDCA}, a.TrustDomain); err != nil {
		return fail(DevIDCAKeyFile, err)
	}

	if a.ServingCA, err = readOneCert(dir, ServingCACertFile); err != nil {
		return nil, err
	}
	if err := a.ServingCA.CheckSignatureFrom(a.Root); err != nil {
		return fail(ServingCACertFile, fmt.Errorf("not signed by %s: %w", RootCACertFile, err))
	}
	if got := PinOfCert(a.ServingCA); !got.Equal(a.Bundle.ServingCASPKIPin) {
		return fail(ServingCACertFile, fmt.Errorf("pin %s is not serving_ca_spki_pin %s of %s", got, a.Bundle.ServingCASPKIPin, BundleFile))
	}

	chain, err := ReadCerts(Path(dir, ServingCertFile))
	if err != nil {
		return nil, fmt.Errorf("load pki: %w", err)
	}
	if len(chain) < 2 || !bytes.Equal(chain[1].Raw, a.ServingCA.Raw) {
		return fail(ServingCertFile, errors.New("want the serving certificate followed by "+ServingCACertFile))
	}
	if err := chain[0].CheckSignatureFrom(a.ServingCA); err != nil {
		return fail(ServingCertFile, fmt.Errorf("not signed by %s: %w", ServingCACertFile, err))
	}
	servingKey, err := openKey(dir, KeyServing, open)
	if err != nil {
		return nil, fmt.Errorf("load pki: %w", err)
	}
	if !publicKeysEqual(servingKey.Public(), chain[0].PublicKey) {
		return fail(ServingKeyFile, errors.New("key does not match "+ServingCertFile))
	}
	a.ServingCert = tls.Certificate{PrivateKey: servingKey, Leaf: chain[0]}
	for _, c := range chain {
		a.ServingCert.Certificate = append(a.ServingCert.Certificate, c.Raw)
	}

	if a.JoinSigner, err = openKey(dir, KeyJoinSigning, open); err != nil {
		return nil, fmt.Errorf("load pki: %w", err)
	}
	if !isP256(a.JoinSigner.Public()) {
		return fail(JoinSigningKeyFile, fmt.Errorf("key is %T, want ECDSA P-256", a.JoinSigner.Public()))
	}
	if got, err := PinOf(a.JoinSigner.Public()); err != nil || !got.Equal(a.Bundle.JoinSigningKeyPin) {
		return fail(JoinSigningKeyFile, fmt.Errorf("pin %s is not join_signing_key_pin %s of %s", got, a.Bundle.JoinSigningKeyPin, BundleFile))
	}

	encPEM, err := os.ReadFile(Path(dir, JoinEncryptionKeyFile))
	if err != nil {
		return nil, fmt.Errorf("load pki: read join encryption key: %w", err)
	}
	if a.JoinEncryption, err = ParseJoinEncryptionKeyPEM(encPEM); err != nil {
		return fail(JoinEncryptionKeyFile, err)
	}
	if got := a.JoinEncryption.Public().Pin(); !got.Equal(a.Bundle.JoinEncryptionKeyPin) {
		return fail(JoinEncryptionKeyFile, fmt.Errorf("pin %s is not join_encryption_key_pin %s of %s", got, a.Bundle.JoinEncryptionKeyPin, BundleFile))
	}
	jwk, err := os.ReadFile(Path(dir, JoinEncryptionJWKFile))
	if err != nil {
		return nil, fmt.Errorf("load pki: read join encryption JWK: %w", err)
	}
	pub, err := ParseJWK(jwk)
	if err != nil {
		return fail(JoinEncryptionJWKFile, err)
	}
	if !pub.Equal(a.JoinEncryption.Public()) {
		return fail(JoinEncryptionJWKFile, errors.New("not the public key of "+JoinEncryptionKeyFile))
	}

	if _, err := os.Stat(Path(dir, AdminCACertFile)); errors.Is(err, fs.ErrNotExist) {
		return a, nil
	}
	if a.AdminCA, err = readOneCert(dir, AdminCACertFile); err != nil {
		return nil, err
	}
	if err := a.AdminCA.CheckSignatureFrom(a.Root); err != nil {
		return fail(AdminCACertFile, fmt.Errorf("not signed by %s: %w", RootCACertFile, err))
	}
	if a.AdminSigner, err = openKey(dir, KeyAdminCA, open); err != nil {
		return nil, fmt.Errorf("load pki: %w", err)
	}
	if !publicKeysEqual(a.AdminSigner.Public(), a.AdminCA.PublicKey) {
		return fail(AdminCAKeyFile, errors.New("key does not match "+AdminCACertFile))
	}
	return a, nil
}

// readOneCert reads a file holding exactly one certificate.
func readOneCert(dir, name string) (*x509.Certificate, error) {
	certs, err := ReadCerts(Path(dir, name))
	if err != nil {
		return nil, fmt.Errorf("load pki: %w", err)
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("load pki %s: %d certificates, want 1", Path(dir, name), len(certs))
	}
	return certs[0], nil
}
