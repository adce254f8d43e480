package pki

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"time"
)

// OwnerRole is the role of the owner credential [Init] makes. Which roles
// exist, and what each may do, is fleetd's policy: this package only
// carries a role in a certificate.
const OwnerRole = "owner"

// AdminCertInfo is the identity an admin client certificate carries.
type AdminCertInfo struct {
	// Name is the credential's name: spiffe://<td>/admin/<Name>, and the
	// subject's CommonName.
	Name string
	// Role is the subject's one OrganizationalUnit.
	Role string
}

// AdminCertRequest is what [IssueAdminCert] puts in an admin certificate.
type AdminCertRequest struct {
	// PublicKey is the credential's key (ECDSA P-256).
	PublicKey crypto.PublicKey
	// TrustDomain, Name (a valid node id, see [ValidNodeID]) and Role
	// (at most MaxRoleLen bytes of printable UTF-8, not empty).
	TrustDomain, Name, Role string
	// NotBefore and NotAfter are clamped into the CA's validity.
	NotBefore, NotAfter time.Time
}

// IssueAdminCert signs an admin client certificate with the admin CA: a
// random serial; subject CommonName = name, OrganizationalUnit = [role],
// Organization = [trust domain]; the one URI SAN
// spiffe://<td>/admin/<name>; key usage DigitalSignature; extended key
// usage ClientAuth.
func IssueAdminCert(ca *x509.Certificate, key crypto.Signer, r AdminCertRequest) (*x509.Certificate, error) {
	if ca == nil || key == nil {
		return nil, errors.New("issue admin certificate: no admin CA")
	}
	if !isP256(r.PublicKey) {
		return nil, fmt.Errorf("issue admin certificate: key is %T, want ECDSA P-256", r.PublicKey)
	}
	if err := ValidTrustDomain(r.TrustDomain); err != nil {
		return nil, fmt.Errorf("issue admin certificate: %w", err)
	}
	if err := ValidNodeID(r.Name); err != nil {
		return nil, fmt.Errorf("issue admin certificate: name: %w", err)
	}
	if r.Role == "" {
		return nil, errors.New("issue admin certificate: no role")
	}
	if err := validName("role", r.Role, MaxRoleLen); err != nil {
		return nil, fmt.Errorf("issue admin certificate: %w", err)
	}
	nb, na := r.NotBefore, r.NotAfter
	if nb.Before(ca.NotBefore) {
		nb = ca.NotBefore
	}
	if na.After(ca.NotAfter) {
		na = ca.NotAfter
	}
	if !na.After(nb) {
		return nil, fmt.Errorf("issue admin certificate: validity %s to %s is empty inside the admin CA's", r.NotBefore, r.NotAfter)
	}
	id, err := AdminID(r.TrustDomain, r.Name)
	if err != nil {
		return nil, fmt.Errorf("issue admin certificate: %w", err)
	}
	c, err := createCert(&x509.Certificate{
		Subject:               pkix.Name{CommonName: r.Name, OrganizationalUnit: []string{r.Role}, Organization: []string{r.TrustDomain}},
		NotBefore:             nb,
		NotAfter:              na,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{id.URL()},
	}, ca, r.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("issue admin certificate for %s: %w", r.Name, err)
	}
	return c, nil
}

// ParseAdminCert reads the name and role of an admin certificate made by
// [IssueAdminCert] for trustDomain. It does not verify the certificate:
// the caller has verified it against the admin CA (the TLS handshake
// does). It refuses a CA certificate, a certificate whose only spiffe URI
// is not spiffe://<trustDomain>/admin/<name>, whose CommonName is not the
// name, or which does not carry exactly one role.
func ParseAdminCert(c *x509.Certificate, trustDomain string) (AdminCertInfo, error) {
	if c == nil {
		return AdminCertInfo{}, errors.New("parse admin certificate: no certificate")
	}
	if c.IsCA {
		return AdminCertInfo{}, errors.New("parse admin certificate: certificate is a CA")
	}
	name, ok := AdminIdentity(c, trustDomain)
	if !ok {
		return AdminCertInfo{}, fmt.Errorf("parse admin certificate: no single spiffe://%s/admin/<name> URI", trustDomain)
	}
	if c.Subject.CommonName != name {
		return AdminCertInfo{}, fmt.Errorf("parse admin certificate: common name %q is not the name %q", c.Subject.CommonName, name)
	}
	if len(c.Subject.OrganizationalUnit) != 1 || strings.TrimSpace(c.Subject.OrganizationalUnit[0]) == "" {
		return AdminCertInfo{}, fmt.Errorf("parse admin certificate: %d roles, want one", len(c.Subject.OrganizationalUnit))
	}
	return AdminCertInfo{Name: name, Role: c.Subject.OrganizationalUnit[0]}, nil
}

// AddAdminCA adds the admin CA (admin-ca.crt and admin-ca.key) to a PKI
// directory [Init] wrote before it made one, signing it with root-ca.key,
// which must be in dir. It refuses, wrapping [ErrExists], when the admin
// CA is there already. The owner credential already in admin/ keeps
// working; new credentials come from the admin CA.
func AddAdminCA(dir string, now time.Time) error {
	return addSubCA(dir, AdminCACertFile, AdminCAKeyFile, "admin CA", now)
}

// AddDevIDCA adds the DevID CA (devid-ca.crt and devid-ca.key, a key
// file) to a PKI directory [Init] wrote before it made one, signing it
// with root-ca.key, which must be in dir. It refuses, wrapping
// [ErrExists], when the DevID CA is there already. Nothing else changes:
// node certificates and pins stay as they are.
func AddDevIDCA(dir string, now time.Time) error {
	return addSubCA(dir, DevIDCACertFile, DevIDCAKeyFile, KeyDevIDCA.Description(), now)
}

// addSubCA adds a CA under the root, label, as certFile and keyFile of dir.
func addSubCA(dir, certFile, keyFile, label string, now time.Time) error {
	fail := func(err error) error { return fmt.Errorf("add %s: %w", label, err) }
	for _, name := range []string{certFile, keyFile} {
		if _, err := os.Lstat(Path(dir, name)); err == nil {
			return fail(fmt.Errorf("%s: %w", Path(dir, name), ErrExists))
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fail(err)
		}
	}
	root, err := readOneCert(dir, RootCACertFile)
	if err != nil {
		return fail(err)
	}
	rootKey, err := ReadPrivateKey(Path(dir, RootCAKeyFile))
	if err != nil {
		return fail(fmt.Errorf("the root CA's key is needed: %w", err))
	}
	if !publicKeysEqual(rootKey.Public(), root.PublicKey) {
		return fail(fmt.Errorf("%s does not match %s", RootCAKeyFile, RootCACertFile))
	}
	if now.IsZero() {
		now = time.Now()
	}
	td := ""
	if len(root.Subject.Organization) == 1 {
		td = root.Subject.Organization[0]
	}
	ca, key, err := makeSubCA(root, rootKey, label, td, now)
	if err != nil {
		return fail(err)
	}
	keyPEM, err := MarshalPrivateKeyPEM(key)
	if err != nil {
		return fail(err)
	}
	if err := writeNewFile(Path(dir, keyFile), keyPEM, PrivateKeyMode); err != nil {
		return fail(err)
	}
	if err := writeNewFile(Path(dir, certFile), EncodeCertsPEM(ca), PublicFileMode); err != nil {
		os.Remove(Path(dir, keyFile))
		return fail(err)
	}
	return syncDir(dir)
}

// makeSubCA makes a CA under root for label: 5 years, path length 0.
func makeSubCA(root *x509.Certificate, rootKey crypto.Signer, label, td string, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	c, err := createCert(&x509.Certificate{
		Subject:               pkix.Name{CommonName: initCertSubjectLabel + " " + label, Organization: []string{td}},
		NotBefore:             now.Add(-initBackdate),
		NotAfter:              now.AddDate(caLifetimeYears, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}, root, key.Public(), rootKey)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", label, err)
	}
	return c, key, nil
}
