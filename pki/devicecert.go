package pki

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// DeviceKind says what a device certificate ([Issuer.IssueDevice])
// certifies; it is the subject's OrganizationalUnit.
type DeviceKind string

// The device certificates intake issues under the DevID CA (seed 003,
// "Attestation and admission").
const (
	// LDevID certifies a TPM-held device key (a local device identity,
	// IEEE 802.1AR's LDevID).
	LDevID DeviceKind = "ldevid"
	// LAK certifies the TPM attestation key that signs the device's later
	// boot evidence.
	LAK DeviceKind = "lak"
)

// MaxDeviceSerialLen bounds the declared serial a device certificate
// carries (X.520's upper bound for a serialNumber attribute).
const MaxDeviceSerialLen = 64

// productUUIDPattern is a product UUID as SMBIOS reports it, in its
// canonical text form (either case).
var productUUIDPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// DeviceRequest is what [Issuer.IssueDevice] puts in a device
// certificate. The caller has decided every field from the declaration
// and the TPM's proof.
type DeviceRequest struct {
	Kind DeviceKind
	// PublicKey is the device key (LDevID) or the AK (LAK), ECDSA P-256.
	PublicKey crypto.PublicKey
	// Device is the declared device's name; it must pass [ValidNodeID].
	Device string
	// Serial is the declared serial, the subject's serialNumber; empty
	// leaves it out. Printable, at most MaxDeviceSerialLen bytes.
	Serial string
	// ProductUUID is the declared product UUID, the URI SAN
	// urn:uuid:<lower-case uuid>; empty leaves it out.
	ProductUUID string
	// TPMAKName is the TPM name of the AK that certified the device key
	// (LDevID) or of the AK itself (LAK), carried in [OIDTPMAKName].
	TPMAKName []byte
	// NotBefore and NotAfter bound the certificate, clamped into the CA's
	// validity as [Issuer.Issue] does.
	NotBefore, NotAfter time.Time
}

// IssueDevice signs a device certificate: a random positive serial;
// subject CommonName = the device, serialNumber = its declared serial,
// OrganizationalUnit = the kind, Organization = the trust domain; the URI
// SAN urn:uuid:<product uuid> when one is declared; the extension
// [OIDTPMAKName]; key usage DigitalSignature; an LDevID has the extended
// key usage ClientAuth, a LAK none (an AK signs only TPM-made structures).
// It is no X.509-SVID: the Issuer must be the DevID CA's, never the node
// CA's, so that a device certificate is never taken for a node identity.
func (i *Issuer) IssueDevice(r DeviceRequest) (*x509.Certificate, error) {
	if r.Kind != LDevID && r.Kind != LAK {
		return nil, fmt.Errorf("issue device certificate: kind %q, want %q or %q", r.Kind, LDevID, LAK)
	}
	fail := func(err error) (*x509.Certificate, error) {
		return nil, fmt.Errorf("issue %s for %s: %w", r.Kind, r.Device, err)
	}
	if err := ValidNodeID(r.Device); err != nil {
		return nil, fmt.Errorf("issue %s: device name: %w", r.Kind, err)
	}
	if !isP256(r.PublicKey) {
		return fail(fmt.Errorf("key is %T, want ECDSA P-256", r.PublicKey))
	}
	if err := validName("serial", r.Serial, MaxDeviceSerialLen); err != nil {
		return fail(err)
	}
	if r.ProductUUID != "" && !productUUIDPattern.MatchString(r.ProductUUID) {
		return fail(fmt.Errorf("product UUID %q is not a UUID", r.ProductUUID))
	}
	if len(r.TPMAKName) == 0 {
		return fail(errors.New("no TPM AK name"))
	}
	if len(r.TPMAKName) > maxTPMNameLen {
		return fail(fmt.Errorf("TPM AK name is %d bytes, more than %d", len(r.TPMAKName), maxTPMNameLen))
	}
	if r.NotBefore.IsZero() || r.NotAfter.IsZero() {
		return fail(errors.New("NotBefore and NotAfter are required"))
	}
	notBefore, notAfter := r.NotBefore, r.NotAfter
	if notBefore.Before(i.ca.NotBefore) {
		notBefore = i.ca.NotBefore
	}
	if notAfter.After(i.ca.NotAfter) {
		notAfter = i.ca.NotAfter
	}
	if !notAfter.After(notBefore) {
		return fail(fmt.Errorf("validity %s to %s is empty inside the CA's", r.NotBefore.UTC().Format(time.RFC3339), r.NotAfter.UTC().Format(time.RFC3339)))
	}
	ext, err := tpmAKNameExtension(r.TPMAKName)
	if err != nil {
		return fail(err)
	}
	serial, err := randomSerial()
	if err != nil {
		return fail(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName: r.Device, SerialNumber: r.Serial,
			OrganizationalUnit: []string{string(r.Kind)}, Organization: []string{i.trustDomain},
		},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		ExtraExtensions:       []pkix.Extension{ext},
	}
	if r.Kind == LDevID {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	if r.ProductUUID != "" {
		tmpl.URIs = []*url.URL{{Scheme: "urn", Opaque: "uuid:" + strings.ToLower(r.ProductUUID)}}
	}
	der, err := i.signLeaf(tmpl, r.PublicKey)
	if err != nil {
		return fail(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return fail(fmt.Errorf("parse: %w", err))
	}
	return c, nil
}

// DeviceCertInfo is what a device certificate made by
// [Issuer.IssueDevice] says.
type DeviceCertInfo struct {
	Kind        DeviceKind
	Device      string
	Serial      string
	ProductUUID string
	TPMAKName   []byte
}

// ParseDeviceCert reads a device certificate made by [Issuer.IssueDevice].
// It does not verify its signature or validity: callers verify the chain
// to the DevID CA first.
func ParseDeviceCert(c *x509.Certificate) (DeviceCertInfo, error) {
	var info DeviceCertInfo
	if len(c.Subject.OrganizationalUnit) != 1 {
		return info, errors.New("device certificate: want one organizational unit naming its kind")
	}
	info.Kind = DeviceKind(c.Subject.OrganizationalUnit[0])
	if info.Kind != LDevID && info.Kind != LAK {
		return info, fmt.Errorf("device certificate: kind %q, want %q or %q", info.Kind, LDevID, LAK)
	}
	info.Device, info.Serial = c.Subject.CommonName, c.Subject.SerialNumber
	for _, u := range c.URIs {
		if u.Scheme == "urn" && strings.HasPrefix(u.Opaque, "uuid:") {
			info.ProductUUID = strings.TrimPrefix(u.Opaque, "uuid:")
		}
	}
	for _, e := range c.Extensions {
		if e.Id.Equal(OIDTPMAKName) {
			name, err := parseTPMAKNameExtension(e.Value)
			if err != nil {
				return info, fmt.Errorf("device certificate: %w", err)
			}
			info.TPMAKName = name
		}
	}
	if len(info.TPMAKName) == 0 {
		return info, errors.New("device certificate: no TPM AK name")
	}
	return info, nil
}
