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
	"time"
	"unicode/utf8"
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
	spki, err := marshalSPKI(pub)
	if err != nil {
		return nil, err
	}
	subject, err := marshalSubject(tmpl.Subject)
	if err != nil {
		return nil, err
	}
	exts, err := leafExtensions(tmpl, i.ca.SubjectKeyId)
	if err != nil {
		return nil, err
	}
	serial := tmpl.SerialNumber
	if serial == nil || serial.Sign() <= 0 {
		return nil, errors.New("internal error: a leaf's serial must be positive")
	}
	sigAlg := sigAlgDER(sigOID)
	// The TBSCertificate (RFC 5280 section 4.1), DER-encoded by hand: the
	// reflection of encoding/asn1 was about a fifth of a join's
	// allocations.
	body := make([]byte, 0, 512+len(i.ca.RawSubject)+len(subject)+len(spki))
	body = append(body, 0xa0, 0x03, 0x02, 0x01, 0x02) // [0] EXPLICIT version v3
	serialBytes := serial.Bytes()
	if serialBytes[0]&0x80 != 0 {
		serialBytes = append([]byte{0}, serialBytes...)
	}
	body = appendDER(body, 0x02, serialBytes)
	body = append(body, sigAlg...)
	body = append(body, i.ca.RawSubject...)
	validity := make([]byte, 0, 2*17)
	validity = appendDERTime(validity, tmpl.NotBefore)
	validity = appendDERTime(validity, tmpl.NotAfter)
	body = appendDER(body, 0x30, validity)
	body = append(body, subject...)
	body = append(body, spki...)
	if len(exts) > 0 {
		var list []byte
		for _, e := range exts {
			list = appendDER(list, 0x30, e)
		}
		body = appendDER(body, 0xa3, appendDER(nil, 0x30, list)) // [3] EXPLICIT
	}
	tbs := appendDER(make([]byte, 0, len(body)+4), 0x30, body)
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
	cert := make([]byte, 0, len(tbs)+len(sigAlg)+len(sig)+8)
	cert = append(cert, tbs...)
	cert = append(cert, sigAlg...)
	cert = appendDERLen(append(cert, 0x03), 1+len(sig)) // BIT STRING, no unused bits
	cert = append(cert, 0)
	cert = append(cert, sig...)
	return appendDER(make([]byte, 0, len(cert)+4), 0x30, cert), nil
}

// derP256SPKIPrefix is the start of a P-256 key's SubjectPublicKeyInfo up
// to its uncompressed point: SEQUENCE { SEQUENCE { id-ecPublicKey,
// prime256v1 }, BIT STRING { 0 unused bits, ... } }.
var derP256SPKIPrefix = []byte{
	0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
	0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
}

// marshalSPKI is x509.MarshalPKIXPublicKey(pub), written without
// encoding/asn1's reflection for a P-256 key (every node key): that
// reflection was a tenth of a leaf's signing outside the signature.
// TestMarshalSPKIMatchesX509 compares the two.
func marshalSPKI(pub crypto.PublicKey) ([]byte, error) {
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok || k.Curve != elliptic.P256() {
		return x509.MarshalPKIXPublicKey(pub)
	}
	point, err := k.Bytes()
	if err != nil {
		return nil, fmt.Errorf("P-256 public key: %w", err)
	}
	return append(append(make([]byte, 0, len(derP256SPKIPrefix)+len(point)), derP256SPKIPrefix...), point...), nil
}

// DER object identifiers of the attributes of a node certificate's subject.
var (
	derOIDLocality     = mustDER(asn1.ObjectIdentifier{2, 5, 4, 7})
	derOIDOrganization = mustDER(asn1.ObjectIdentifier{2, 5, 4, 10})
	derOIDOrgUnit      = mustDER(asn1.ObjectIdentifier{2, 5, 4, 11})
	derOIDCommonName   = mustDER(asn1.ObjectIdentifier{2, 5, 4, 3})
)

// marshalSubject is asn1.Marshal(n.ToRDNSequence()), written by hand for
// the subjects Issue makes (a common name and at most one organization,
// organizational unit and locality: encoding/asn1's reflection was about
// a tenth of a leaf's signing outside the signature); any other name goes
// to encoding/asn1. Like encoding/asn1, it writes a value as a
// PrintableString when every byte is in that string type's set, else as a
// UTF8String. TestMarshalSubjectMatchesEncodingASN1 compares the two.
func marshalSubject(n pkix.Name) ([]byte, error) {
	if len(n.Country)+len(n.Province)+len(n.StreetAddress)+len(n.PostalCode)+len(n.ExtraNames) > 0 ||
		n.SerialNumber != "" || len(n.Locality) > 1 || len(n.Organization) > 1 || len(n.OrganizationalUnit) > 1 {
		return asn1.Marshal(n.ToRDNSequence())
	}
	// ToRDNSequence's order: locality, organization, unit, common name.
	var oids [4][]byte
	var values [4]string
	k := 0
	add := func(oid []byte, v []string) {
		if len(v) == 1 {
			oids[k], values[k] = oid, v[0]
			k++
		}
	}
	add(derOIDLocality, n.Locality)
	add(derOIDOrganization, n.Organization)
	add(derOIDOrgUnit, n.OrganizationalUnit)
	if n.CommonName != "" {
		add(derOIDCommonName, []string{n.CommonName})
	}
	var rdns []byte
	for i, v := range values[:k] {
		if !utf8.ValidString(v) {
			return asn1.Marshal(n.ToRDNSequence()) // its error
		}
		tag := byte(asn1.TagPrintableString)
		for j := 0; j < len(v); j++ {
			if !printableStringByte(v[j]) {
				tag = asn1.TagUTF8String
				break
			}
		}
		atv := appendDER(append(make([]byte, 0, len(oids[i])+len(v)+4), oids[i]...), tag, []byte(v))
		rdns = appendDER(rdns, 0x31, appendDER(make([]byte, 0, len(atv)+4), 0x30, atv)) // SET { SEQUENCE }
	}
	return appendDER(make([]byte, 0, len(rdns)+4), 0x30, rdns), nil
}

// printableStringByte says whether encoding/asn1 writes b in a
// PrintableString (its set, without '*' and '&').
func printableStringByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
		'\'' <= b && b <= ')' || '+' <= b && b <= '/' || b == ' ' || b == ':' || b == '=' || b == '?'
}

// appendDER appends the DER element of tag and content to b.
func appendDER(b []byte, tag byte, content []byte) []byte {
	return append(appendDERLen(append(b, tag), len(content)), content...)
}

// appendDERLen appends a DER length to b.
func appendDERLen(b []byte, n int) []byte {
	switch {
	case n < 0x80:
		return append(b, byte(n))
	case n <= 0xff:
		return append(b, 0x81, byte(n))
	case n <= 0xffff:
		return append(b, 0x82, byte(n>>8), byte(n))
	default:
		return append(b, 0x83, byte(n>>16), byte(n>>8), byte(n))
	}
}

// appendDERTime appends t as encoding/asn1 and x509.CreateCertificate
// write a validity time: UTCTime from 1950 to 2049, GeneralizedTime
// otherwise, in UTC to the second.
func appendDERTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	if y := t.Year(); y >= 1950 && y < 2050 {
		return appendDER(b, 0x17, t.AppendFormat(make([]byte, 0, 13), "060102150405Z"))
	}
	return appendDER(b, 0x18, t.AppendFormat(make([]byte, 0, 15), "20060102150405Z"))
}

// DER encodings of the fixed parts of a node certificate.
var (
	derECDSAWithSHA256 = mustDER(pkix.AlgorithmIdentifier{Algorithm: oidECDSAWithSHA256})
	derECDSAWithSHA384 = mustDER(pkix.AlgorithmIdentifier{Algorithm: oidECDSAWithSHA384})
	derECDSAWithSHA512 = mustDER(pkix.AlgorithmIdentifier{Algorithm: oidECDSAWithSHA512})
	derExtKeyUsage     = mustDER(oidExtKeyUsage)
	derExtExtKeyUsage  = mustDER(oidExtExtKeyUsage)
	derExtBasicCons    = mustDER(oidExtBasicCons)
	derExtAuthKeyID    = mustDER(oidExtAuthorityKeyID)
	derExtSAN          = mustDER(oidExtSubjectAltName)
	derEKUServerAuth   = mustDER(oidEKUServerAuth)
	derEKUClientAuth   = mustDER(oidEKUClientAuth)
	derTPMAKName       = mustDER(OIDTPMAKName)
)

func mustDER(v any) []byte {
	b, err := asn1.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// sigAlgDER is the DER AlgorithmIdentifier of oid, one of ecdsaSigAlg's.
func sigAlgDER(oid asn1.ObjectIdentifier) []byte {
	switch {
	case oid.Equal(oidECDSAWithSHA384):
		return derECDSAWithSHA384
	case oid.Equal(oidECDSAWithSHA512):
		return derECDSAWithSHA512
	}
	return derECDSAWithSHA256
}

// leafExtensions returns the contents of the Extension SEQUENCEs of a
// node certificate in the order x509.CreateCertificate writes them: key
// usage, extended key usage, basic constraints, authority key id, subject
// alternative name, then tmpl.ExtraExtensions.
func leafExtensions(tmpl *x509.Certificate, caKeyID []byte) ([][]byte, error) {
	if tmpl.KeyUsage != x509.KeyUsageDigitalSignature || !tmpl.BasicConstraintsValid || tmpl.IsCA ||
		len(tmpl.DNSNames)+len(tmpl.IPAddresses)+len(tmpl.EmailAddresses) > 0 {
		return nil, fmt.Errorf("internal error: the leaf template is not a node certificate's")
	}
	exts := make([][]byte, 0, 5+len(tmpl.ExtraExtensions))
	ext := func(id []byte, critical bool, value []byte) {
		e := make([]byte, 0, len(id)+3+len(value)+4)
		e = append(e, id...)
		if critical {
			e = append(e, 0x01, 0x01, 0xff)
		}
		exts = append(exts, appendDER(e, 0x04, value))
	}
	// Key usage digitalSignature: a BIT STRING of one bit (seven unused).
	ext(derExtKeyUsage, true, []byte{0x03, 0x02, 0x07, 0x80})
	var ekus []byte
	for _, u := range tmpl.ExtKeyUsage {
		switch u {
		case x509.ExtKeyUsageClientAuth:
			ekus = append(ekus, derEKUClientAuth...)
		case x509.ExtKeyUsageServerAuth:
			ekus = append(ekus, derEKUServerAuth...)
		default:
			return nil, fmt.Errorf("internal error: extended key usage %d", u)
		}
	}
	if len(ekus) > 0 {
		ext(derExtExtKeyUsage, false, appendDER(nil, 0x30, ekus))
	}
	// Basic constraints of an end entity: an empty SEQUENCE, critical.
	ext(derExtBasicCons, true, []byte{0x30, 0x00})
	if len(caKeyID) > 0 {
		// SEQUENCE { [0] IMPLICIT OCTET STRING keyIdentifier }
		ext(derExtAuthKeyID, false, appendDER(nil, 0x30, appendDER(nil, 0x80, caKeyID)))
	}
	if len(tmpl.URIs) > 0 {
		var names []byte
		for _, u := range tmpl.URIs {
			names = appendDER(names, 0x86, []byte(u.String())) // [6] IMPLICIT IA5String
		}
		// Critical only when the subject is empty; a node certificate's
		// never is.
		ext(derExtSAN, false, appendDER(nil, 0x30, names))
	}
	for _, e := range tmpl.ExtraExtensions {
		id := derTPMAKName
		if !e.Id.Equal(OIDTPMAKName) {
			var err error
			if id, err = asn1.Marshal(e.Id); err != nil {
				return nil, err
			}
		}
		ext(id, e.Critical, e.Value)
	}
	return exts, nil
}
