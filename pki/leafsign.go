package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Object identifiers of what a node certificate holds.
var (
	oidExtKeyUsage       = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtExtKeyUsage    = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidExtBasicCons      = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidExtAuthorityKeyID = asn1.ObjectIdentifier{2, 5, 29, 35}
	oidExtSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidEKUServerAuth     = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1}
	oidEKUClientAuth     = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2}
	oidECDSAWithSHA256   = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 2}
	oidECDSAWithSHA384   = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 3}
	oidECDSAWithSHA512   = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 4}
)

type leafTBS struct {
	Version      int `asn1:"optional,explicit,default:0,tag:0"`
	SerialNumber *big.Int
	SigAlg       pkix.AlgorithmIdentifier
	Issuer       asn1.RawValue
	Validity     leafValidity
	Subject      asn1.RawValue
	PublicKey    asn1.RawValue
	Extensions   []pkix.Extension `asn1:"omitempty,optional,explicit,tag:3"`
}

type leafValidity struct {
	NotBefore, NotAfter time.Time
}

type leafCert struct {
	TBS      asn1.RawValue
	SigAlg   pkix.AlgorithmIdentifier
	SigValue asn1.BitString
}

type authKeyID struct {
	ID []byte `asn1:"optional,tag:0"`
}

// ecdsaSigAlg returns the signature algorithm and hash Go's x509 uses for
// an ECDSA CA key, or false for any other key.
func ecdsaSigAlg(pub crypto.PublicKey) (asn1.ObjectIdentifier, crypto.Hash, bool) {
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return nil, 0, false
	}
	switch k.Curve {
	case elliptic.P256():
		return oidECDSAWithSHA256, crypto.SHA256, true
	case elliptic.P384():
		return oidECDSAWithSHA384, crypto.SHA384, true
	case elliptic.P521():
		return oidECDSAWithSHA512, crypto.SHA512, true
	}
	return nil, 0, false
}

// signLeaf encodes and signs the node certificate of tmpl under the
// issuer's CA, as x509.CreateCertificate would for this template (the
// test TestSignLeafMatchesCreateCertificate compares the two byte for
// byte), without CreateCertificate's verification of the signature it has
// just made: with the CA's key in memory (*ecdsa.PrivateKey, Go's own
// signing) that check costs an ECDSA verification per certificate and
// guards only against a faulty crypto.Signer. A key in a token (any other
// crypto.Signer) is still checked. Only the fields Issue sets are encoded;
// for a CA key that is not ECDSA it calls x509.CreateCertificate.
func (i *Issuer) signLeaf(tmpl *x509.Certificate, pub crypto.PublicKey) ([]byte, error) {
	sigOID, hash, ok := ecdsaSigAlg(i.key.Public())
	if !ok {
		return x509.CreateCertificate(rand.Reader, tmpl, i.ca, pub, i.key)
	}
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	subject, err := asn1.Marshal(tmpl.Subject.ToRDNSequence())
	if err != nil {
		return nil, err
	}
	exts, err := leafExtensions(tmpl, i.ca.SubjectKeyId)
	if err != nil {
		return nil, err
	}
	sigAlg := pkix.AlgorithmIdentifier{Algorithm: sigOID}
	tbs, err := asn1.Marshal(leafTBS{
		Version:      2,
		SerialNumber: tmpl.SerialNumber,
		SigAlg:       sigAlg,
		Issuer:       asn1.RawValue{FullBytes: i.ca.RawSubject},
		Validity:     leafValidity{tmpl.NotBefore.UTC(), tmpl.NotAfter.UTC()},
		Subject:      asn1.RawValue{FullBytes: subject},
		PublicKey:    asn1.RawValue{FullBytes: spki},
		Extensions:   exts,
	})
	if err != nil {
		return nil, err
	}
	h := hash.New()
	h.Write(tbs)
	digest := h.Sum(nil)
	sig, err := i.key.Sign(rand.Reader, digest, hash)
	if err != nil {
		return nil, err
	}
	if _, inMemory := i.key.(*ecdsa.PrivateKey); !inMemory {
		if !ecdsa.VerifyASN1(i.key.Public().(*ecdsa.PublicKey), digest, sig) {
			return nil, errors.New("the CA key's signer returned a signature that does not verify")
		}
	}
	return asn1.Marshal(leafCert{
		TBS:      asn1.RawValue{FullBytes: tbs},
		SigAlg:   sigAlg,
		SigValue: asn1.BitString{Bytes: sig, BitLength: 8 * len(sig)},
	})
}

// leafExtensions returns the extensions of a node certificate in the
// order x509.CreateCertificate writes them: key usage, extended key
// usage, basic constraints, authority key id, subject alternative name,
// then tmpl.ExtraExtensions.
func leafExtensions(tmpl *x509.Certificate, caKeyID []byte) ([]pkix.Extension, error) {
	if tmpl.KeyUsage != x509.KeyUsageDigitalSignature || !tmpl.BasicConstraintsValid || tmpl.IsCA ||
		len(tmpl.DNSNames)+len(tmpl.IPAddresses)+len(tmpl.EmailAddresses) > 0 {
		return nil, fmt.Errorf("internal error: the leaf template is not a node certificate's")
	}
	exts := make([]pkix.Extension, 0, 5+len(tmpl.ExtraExtensions))
	// Key usage digitalSignature: bit 0, one bit long.
	ku, err := asn1.Marshal(asn1.BitString{Bytes: []byte{0x80}, BitLength: 1})
	if err != nil {
		return nil, err
	}
	exts = append(exts, pkix.Extension{Id: oidExtKeyUsage, Critical: true, Value: ku})
	var ekus []asn1.ObjectIdentifier
	for _, u := range tmpl.ExtKeyUsage {
		switch u {
		case x509.ExtKeyUsageClientAuth:
			ekus = append(ekus, oidEKUClientAuth)
		case x509.ExtKeyUsageServerAuth:
			ekus = append(ekus, oidEKUServerAuth)
		default:
			return nil, fmt.Errorf("internal error: extended key usage %d", u)
		}
	}
	if len(ekus) > 0 {
		b, err := asn1.Marshal(ekus)
		if err != nil {
			return nil, err
		}
		exts = append(exts, pkix.Extension{Id: oidExtExtKeyUsage, Value: b})
	}
	// Basic constraints of an end entity: an empty SEQUENCE, critical.
	exts = append(exts, pkix.Extension{Id: oidExtBasicCons, Critical: true, Value: []byte{0x30, 0x00}})
	if len(caKeyID) > 0 {
		b, err := asn1.Marshal(authKeyID{ID: caKeyID})
		if err != nil {
			return nil, err
		}
		exts = append(exts, pkix.Extension{Id: oidExtAuthorityKeyID, Value: b})
	}
	if len(tmpl.URIs) > 0 {
		var names []asn1.RawValue
		for _, u := range tmpl.URIs {
			names = append(names, asn1.RawValue{Tag: 6, Class: asn1.ClassContextSpecific, Bytes: []byte(u.String())})
		}
		b, err := asn1.Marshal(names)
		if err != nil {
			return nil, err
		}
		// Critical only when the subject is empty; a node certificate's
		// never is.
		exts = append(exts, pkix.Extension{Id: oidExtSubjectAltName, Value: b})
	}
	return append(exts, tmpl.ExtraExtensions...), nil
}
