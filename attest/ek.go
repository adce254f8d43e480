package attest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	gattest "github.com/google/go-attestation/attest"
	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// MaxEKCertificateSize is the largest EK certificate VerifyEKCertificate
// parses. EK certificate NV indices hold a few kilobytes at most.
const MaxEKCertificateSize = 16 << 10

// MaxEKChain is the most intermediate certificates
// [Verifier.VerifyEKCertificateChain] takes from a node: vendor chains
// between an EK certificate and its root have two to four.
const MaxEKChain = 8

// Config configures a [Verifier].
type Config struct {
	// Roots are the TPM manufacturers' root certificates an EK certificate
	// must chain to. Required; an empty pool trusts no EK certificate
	// (for a fleet that admits EKs by pin only).
	Roots *x509.CertPool
	// Intermediates are manufacturer intermediate CAs to build chains
	// with, for EK certificates whose NV index holds the leaf alone.
	// Optional. They are not trusted by themselves.
	Intermediates *x509.CertPool
	// Now returns the time certificates are checked at. Default time.Now.
	Now func() time.Time
}

// Verifier checks EK certificates against the configured manufacturer roots.
// It is safe for concurrent use.
type Verifier struct {
	roots         *x509.CertPool
	intermediates *x509.CertPool
	now           func() time.Time
}

// New returns a Verifier for cfg, filling in the defaults. cfg.Roots is
// required.
func New(cfg Config) (*Verifier, error) {
	if cfg.Roots == nil {
		return nil, errors.New("attest: Config.Roots, the TPM manufacturer roots, is not set")
	}
	v := &Verifier{roots: cfg.Roots, intermediates: cfg.Intermediates, now: cfg.Now}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

var (
	// oidSubjectAltName is id-ce-subjectAltName (RFC 5280, section 4.2.1.6).
	oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}
	// The TPM attributes of an EK certificate's subjectAltName
	// directoryName (TCG EK Credential Profile 2.5, section 3.2.9 "Subject
	// Alternative Name"; TCG OIDs tcg-at-tpmManufacturer, tcg-at-tpmModel,
	// tcg-at-tpmVersion).
	oidTPMManufacturer = asn1.ObjectIdentifier{2, 23, 133, 2, 1}
	oidTPMModel        = asn1.ObjectIdentifier{2, 23, 133, 2, 2}
	oidTPMVersion      = asn1.ObjectIdentifier{2, 23, 133, 2, 3}
)

// VerifyEKCertificate checks der, an EK certificate as the node read it from
// its TPM's NV (TCG EK Credential Profile 2.5, section 2.2.1), and returns
// it when it is trusted:
//
//   - It parses as go-attestation's ParseEKCertificate does, tolerating the
//     TCG NV header (0x10 0x01 0x00 and a length) and padding after the
//     certificate.
//   - A critical subjectAltName is accepted only when it holds nothing but
//     the TCG TPM-attributes directoryName (manufacturer, model, version),
//     which crypto/x509 does not understand and leaves unhandled. Any other
//     unhandled critical extension is refused.
//   - It chains to [Config.Roots], through [Config.Intermediates] when
//     needed, valid at [Config.Now], for any extended key usage (EK
//     certificates carry tcg-kp-EKCertificate, not a TLS usage).
//   - It certifies ekPublic, which the caller takes from [EKPublic] of the
//     EK public area it makes the activation challenge for: the certificate
//     alone proves nothing about the TPM the node talks with.
//
// Every error wraps [ErrUntrustedEK]. The manufacturer's attributes are not
// checked against anything; the certificate's subject and SAN are the
// caller's to record.
func (v *Verifier) VerifyEKCertificate(der []byte, ekPublic crypto.PublicKey) (*x509.Certificate, error) {
	return v.VerifyEKCertificateChain(der, nil, ekPublic)
}

// VerifyEKCertificateChain is [Verifier.VerifyEKCertificate] with the
// intermediate CA certificates the node read from its TPM's EK certificate
// chain indices (TCG EK Credential Profile 2.5, section 2.2.1.5.2): they
// join [Config.Intermediates] to build the chain to [Config.Roots] and are
// never trusted by themselves, so a node that sends its own CA gains
// nothing. At most [MaxEKChain] certificates of at most
// [MaxEKCertificateSize] bytes each are taken; one that does not parse
// refuses the whole. Every error wraps [ErrUntrustedEK].
func (v *Verifier) VerifyEKCertificateChain(der []byte, chain [][]byte, ekPublic crypto.PublicKey) (*x509.Certificate, error) {
	if err := checkEKPublicKey(ekPublic); err != nil {
		return nil, err
	}
	if len(der) == 0 {
		return nil, fmt.Errorf("%w: empty EK certificate", ErrUntrustedEK)
	}
	if len(der) > MaxEKCertificateSize {
		return nil, fmt.Errorf("%w: EK certificate of %d bytes, more than %d", ErrUntrustedEK, len(der), MaxEKCertificateSize)
	}
	intermediates := v.intermediates
	if len(chain) > 0 {
		if len(chain) > MaxEKChain {
			return nil, fmt.Errorf("%w: an EK certificate chain of %d certificates, more than %d", ErrUntrustedEK, len(chain), MaxEKChain)
		}
		if intermediates == nil {
			intermediates = x509.NewCertPool()
		} else {
			intermediates = intermediates.Clone()
		}
		for i, c := range chain {
			if len(c) > MaxEKCertificateSize {
				return nil, fmt.Errorf("%w: EK chain certificate %d of %d bytes, more than %d", ErrUntrustedEK, i, len(c), MaxEKCertificateSize)
			}
			ic, err := x509.ParseCertificate(c)
			if err != nil {
				return nil, fmt.Errorf("%w: EK chain certificate %d: %w", ErrUntrustedEK, i, err)
			}
			intermediates.AddCert(ic)
		}
	}
	cert, err := gattest.ParseEKCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%w: parse EK certificate: %w", ErrUntrustedEK, err)
	}
	if err := handleTPMSubjectAltName(cert); err != nil {
		return nil, fmt.Errorf("%w: EK certificate: %w", ErrUntrustedEK, err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{
		Roots:         v.roots,
		Intermediates: intermediates,
		CurrentTime:   v.now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, fmt.Errorf("%w: EK certificate (subject %q, issuer %q, serial %s): %w",
			ErrUntrustedEK, cert.Subject, cert.Issuer, cert.SerialNumber, err)
	}
	eq, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !eq.Equal(ekPublic) {
		return nil, fmt.Errorf("%w: the EK certificate (serial %s) certifies another key than the EK", ErrUntrustedEK, cert.SerialNumber)
	}
	return cert, nil
}

// checkEKPublicKey refuses what cannot be an EK's public key: nil, a typed
// nil (whose Equal and marshalling would panic), or another type than the
// *rsa.PublicKey and *ecdsa.PublicKey [EKPublic] returns.
func checkEKPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if k != nil && k.N != nil {
			return nil
		}
	case *ecdsa.PublicKey:
		if k != nil {
			if _, err := k.Bytes(); err == nil { // a valid point
				return nil
			}
		}
	default:
		if pub != nil {
			return fmt.Errorf("%w: EK public key of type %T, want *rsa.PublicKey or *ecdsa.PublicKey", ErrUntrustedEK, pub)
		}
	}
	return fmt.Errorf("%w: no EK public key", ErrUntrustedEK)
}

// handleTPMSubjectAltName removes the subjectAltName from cert's unhandled
// critical extensions when it is the TCG TPM-attributes directoryName, and
// leaves it there otherwise (so that Verify refuses the certificate).
func handleTPMSubjectAltName(cert *x509.Certificate) error {
	i := slices.IndexFunc(cert.UnhandledCriticalExtensions, func(o asn1.ObjectIdentifier) bool { return o.Equal(oidSubjectAltName) })
	if i < 0 {
		return nil
	}
	for _, ext := range cert.Extensions {
		if !ext.Id.Equal(oidSubjectAltName) {
			continue
		}
		if err := checkTPMSubjectAltName(ext.Value); err != nil {
			return fmt.Errorf("critical subjectAltName: %w", err)
		}
		cert.UnhandledCriticalExtensions = slices.Delete(slices.Clone(cert.UnhandledCriticalExtensions), i, i+1)
		return nil
	}
	return errors.New("critical subjectAltName listed but not present")
}

// checkTPMSubjectAltName accepts a GeneralNames (RFC 5280, section 4.2.1.6)
// made only of directoryNames whose attributes are all TCG TPM attributes.
func checkTPMSubjectAltName(value []byte) error {
	var names []asn1.RawValue
	rest, err := asn1.Unmarshal(value, &names)
	if err != nil {
		return fmt.Errorf("malformed GeneralNames: %w", err)
	}
	if len(rest) != 0 {
		return errors.New("data after GeneralNames")
	}
	if len(names) == 0 {
		return errors.New("no GeneralName")
	}
	for _, n := range names {
		// directoryName [4] Name (EXPLICIT: Name is a CHOICE).
		if n.Class != asn1.ClassContextSpecific || n.Tag != 4 || !n.IsCompound {
			return fmt.Errorf("a GeneralName of tag [%d], want only directoryName [4] with the TPM attributes", n.Tag)
		}
		var rdns pkix.RDNSequence
		rest, err := asn1.Unmarshal(n.Bytes, &rdns)
		if err != nil {
			return fmt.Errorf("malformed directoryName: %w", err)
		}
		if len(rest) != 0 {
			return errors.New("data after directoryName")
		}
		count := 0
		for _, rdn := range rdns {
			for _, atv := range rdn {
				if !atv.Type.Equal(oidTPMManufacturer) && !atv.Type.Equal(oidTPMModel) && !atv.Type.Equal(oidTPMVersion) {
					return fmt.Errorf("directoryName attribute %s, want only TPM manufacturer, model and version", atv.Type)
				}
				count++
			}
		}
		if count == 0 {
			return errors.New("empty directoryName")
		}
	}
	return nil
}

// EKPin returns the pin of an EK public key in the form pins take everywhere
// in nodetrust: "sha256:" followed by the lower-case hex SHA-256 of the
// key's SubjectPublicKeyInfo DER. Compare it with a pin known for a node in
// constant time (crypto/subtle) or as pki.Pin values. It fails for a key
// crypto/x509 cannot marshal.
func EKPin(ekPublic crypto.PublicKey) (string, error) {
	if err := checkEKPublicKey(ekPublic); err != nil {
		return "", err
	}
	der, err := x509.MarshalPKIXPublicKey(ekPublic)
	if err != nil {
		return "", fmt.Errorf("%w: pin of the EK public key: %w", ErrUntrustedEK, err)
	}
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// EKPublic checks that ekPublicArea, a TPMT_PUBLIC (the contents of a
// TPM2B_PUBLIC, TPM 2.0 Part 2, section 12.2.5), describes an endorsement key
// of one of the TCG EK Credential Profile's templates this verifier supports
// — RSA 2048 (L-1, H-1), ECC NIST P-256 (L-2, H-2), ECC NIST P-384 (H-3),
// ECC NIST P-521 (H-4), RSA 3072 (H-6) or RSA 4096 (H-7); not SM2 (H-5) —
// and returns its public key (*rsa.PublicKey or *ecdsa.PublicKey) for
// [Verifier.VerifyEKCertificate] and [EKPin].
//
// An EK is a restricted decryption key: fixedTPM, fixedParent,
// sensitiveDataOrigin, restricted and decrypt set, sign clear, with the
// template's name algorithm and symmetric algorithm (AES-128-CFB with
// SHA-256 names; AES-256-CFB with SHA-384 names for P-384, RSA 3072 and
// RSA 4096; AES-256-CFB with SHA-512 names for P-521), no scheme and
// the default RSA exponent. authPolicy, userWithAuth and adminWithPolicy
// differ between the low and high ranges and are not checked: they govern
// who may use the key in its TPM, not what the key is. Errors wrap
// [ErrUntrustedEK].
func EKPublic(ekPublicArea []byte) (crypto.PublicKey, error) {
	k, _, err := parseEK(ekPublicArea)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUntrustedEK, err)
	}
	return k, nil
}

// parseEK parses and checks an EK public area (see [EKPublic]). Its errors
// wrap [ErrUntrustedEK].
func parseEK(ekPublicArea []byte) (crypto.PublicKey, tpm2.TPMTPublic, error) {
	pub, err := tpmpub.Parse(ekPublicArea)
	if err != nil {
		return nil, tpm2.TPMTPublic{}, partError{ErrUntrustedEK, "EK public area", err}
	}
	k, err := ekPublicKey(pub)
	if err != nil {
		return nil, tpm2.TPMTPublic{}, partError{ErrUntrustedEK, "EK public area", err}
	}
	return k, pub, nil
}

func ekPublicKey(pub tpm2.TPMTPublic) (crypto.PublicKey, error) {
	a := pub.ObjectAttributes
	if !a.FixedTPM || !a.FixedParent || !a.SensitiveDataOrigin || !a.Restricted || !a.Decrypt || a.SignEncrypt {
		return nil, fmt.Errorf("object attributes %#08x, want fixedTPM, fixedParent, sensitiveDataOrigin, restricted and decrypt, and not sign",
			tpmpub.AttributeBits(a))
	}
	switch pub.Type {
	case tpm2.TPMAlgRSA:
		parms, err := pub.Parameters.RSADetail()
		if err != nil {
			return nil, fmt.Errorf("RSA parameters: %w", err)
		}
		// RSA 2048 (L-1, H-1): SHA-256 names, AES-128; RSA 3072 (H-6) and
		// RSA 4096 (H-7): SHA-384 names, AES-256.
		var (
			nameAlg = tpm2.TPMAlgSHA256
			aesBits = 128
		)
		switch parms.KeyBits {
		case 2048:
		case 3072, 4096:
			nameAlg, aesBits = tpm2.TPMAlgSHA384, 256
		default:
			return nil, fmt.Errorf("RSA EK of %d bits, want 2048, 3072 or 4096", parms.KeyBits)
		}
		if pub.NameAlg != nameAlg {
			return nil, fmt.Errorf("RSA %d EK with nameAlg %#x, want %#x", parms.KeyBits, uint16(pub.NameAlg), uint16(nameAlg))
		}
		if err := checkEKSymmetric(parms.Symmetric, aesBits); err != nil {
			return nil, err
		}
		if parms.Scheme.Scheme != tpm2.TPMAlgNull {
			return nil, fmt.Errorf("RSA EK with scheme %#x, want NULL", uint16(parms.Scheme.Scheme))
		}
		if parms.Exponent != 0 && parms.Exponent != 65537 {
			return nil, fmt.Errorf("RSA EK with exponent %d, want the default 65537", parms.Exponent)
		}
		n, err := pub.Unique.RSA()
		if err != nil {
			return nil, fmt.Errorf("RSA modulus: %w", err)
		}
		k, err := tpm2.RSAPub(parms, n)
		if err != nil {
			return nil, fmt.Errorf("RSA public key: %w", err)
		}
		if k.N.BitLen() != int(parms.KeyBits) {
			return nil, fmt.Errorf("RSA modulus of %d bits, want %d", k.N.BitLen(), parms.KeyBits)
		}
		return k, nil
	case tpm2.TPMAlgECC:
		parms, err := pub.Parameters.ECCDetail()
		if err != nil {
			return nil, fmt.Errorf("ECC parameters: %w", err)
		}
		var (
			curve   elliptic.Curve
			nameAlg tpm2.TPMAlgID
			aesBits int
		)
		switch parms.CurveID {
		case tpm2.TPMECCNistP256:
			curve, nameAlg, aesBits = elliptic.P256(), tpm2.TPMAlgSHA256, 128
		case tpm2.TPMECCNistP384:
			curve, nameAlg, aesBits = elliptic.P384(), tpm2.TPMAlgSHA384, 256
		case tpm2.TPMECCNistP521:
			curve, nameAlg, aesBits = elliptic.P521(), tpm2.TPMAlgSHA512, 256
		default:
			return nil, fmt.Errorf("ECC EK on curve %#x, want NIST P-256, P-384 or P-521", uint16(parms.CurveID))
		}
		if pub.NameAlg != nameAlg {
			return nil, fmt.Errorf("ECC EK on curve %#x with nameAlg %#x, want %#x", uint16(parms.CurveID), uint16(pub.NameAlg), uint16(nameAlg))
		}
		if err := checkEKSymmetric(parms.Symmetric, aesBits); err != nil {
			return nil, err
		}
		if parms.Scheme.Scheme != tpm2.TPMAlgNull || parms.KDF.Scheme != tpm2.TPMAlgNull {
			return nil, fmt.Errorf("ECC EK with scheme %#x and KDF %#x, want NULL", uint16(parms.Scheme.Scheme), uint16(parms.KDF.Scheme))
		}
		point, err := pub.Unique.ECC()
		if err != nil {
			return nil, fmt.Errorf("ECC point: %w", err)
		}
		k, err := tpmpub.ECPoint(curve, point.X.Buffer, point.Y.Buffer)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return k, nil
	default:
		return nil, fmt.Errorf("type %#x, want RSA or ECC", uint16(pub.Type))
	}
}

// checkEKSymmetric checks that sym is AES of bits in CFB mode, which the
// TPM uses to protect the credential (Part 1, section 24.4).
func checkEKSymmetric(sym tpm2.TPMTSymDefObject, bits int) error {
	if sym.Algorithm != tpm2.TPMAlgAES {
		return fmt.Errorf("EK symmetric algorithm %#x, want AES", uint16(sym.Algorithm))
	}
	kb, err := sym.KeyBits.AES()
	if err != nil {
		return fmt.Errorf("EK symmetric key bits: %w", err)
	}
	mode, err := sym.Mode.AES()
	if err != nil {
		return fmt.Errorf("EK symmetric mode: %w", err)
	}
	if int(*kb) != bits || *mode != tpm2.TPMAlgCFB {
		return fmt.Errorf("EK symmetric AES-%d mode %#x, want AES-%d-CFB", *kb, uint16(*mode), bits)
	}
	return nil
}
