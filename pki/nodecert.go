package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// OIDTPMAKName identifies nodetrust's own certificate extension that names
// the TPM attestation key (AK) that certified a node key. The extension is
// non-critical, as the X.509-SVID specification allows for extensions of a
// deployment's own; its value is the DER of an OCTET STRING holding the AK's
// TPM name (a 2-byte hash algorithm, then the digest of its public area).
//
// The arc 1.3.6.1.4.1.1842662.1 is provisional: nodetrust holds no IANA
// Private Enterprise Number yet, and this number was free when chosen. A
// registered one replaces it before certificates leave a test fleet.
var OIDTPMAKName = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 1842662, 1, 1}

// TPMAKURNPrefix starts the legacy URI SAN that named the TPM AK before the
// extension [OIDTPMAKName] did: "urn:nodetrust:tpm-ak:" + lower-case hex TPM
// name. Certificates issued now never carry it (an X.509-SVID has exactly
// one URI SAN); [ParseNodeCert] still reads it, so a node whose current
// certificate has this form renews, and its next certificate has the new
// form.
const TPMAKURNPrefix = "urn:nodetrust:tpm-ak:"

// NodeCertInfo is the identity a node certificate carries.
type NodeCertInfo struct {
	NodeID      string
	TrustDomain string
	// SPIFFEID is "spiffe://<TrustDomain>/node/<NodeID>".
	SPIFFEID string
	Role     string
	Site     string
	// TPMAKName is the TPM name of the attestation key that certified the
	// node key, or nil when the certificate names none.
	TPMAKName []byte
	// LegacyAKURN is true when the certificate names the AK in the legacy
	// second URI SAN (TPMAKURNPrefix) instead of the extension: such a
	// certificate is no X.509-SVID; its renewal issues one.
	LegacyAKURN bool
}

// tpmAKNameExtension returns the non-critical extension naming the AK.
func tpmAKNameExtension(name []byte) (pkix.Extension, error) {
	v, err := asn1.Marshal(name)
	if err != nil {
		return pkix.Extension{}, fmt.Errorf("encode the TPM AK name: %w", err)
	}
	return pkix.Extension{Id: OIDTPMAKName, Value: v}, nil
}

// parseTPMAKNameExtension decodes the extension's OCTET STRING.
func parseTPMAKNameExtension(v []byte) ([]byte, error) {
	var name []byte
	rest, err := asn1.Unmarshal(v, &name)
	switch {
	case err != nil:
		return nil, fmt.Errorf("TPM AK name extension: %w", err)
	case len(rest) > 0:
		return nil, errors.New("TPM AK name extension: trailing bytes")
	case len(name) == 0 || len(name) > maxTPMNameLen:
		return nil, fmt.Errorf("TPM AK name extension: a name of %d bytes, want 1 to %d", len(name), maxTPMNameLen)
	}
	return name, nil
}

// ParseNodeCert reads the identity from a node certificate made by
// [Issuer.Issue]. It does not verify the certificate's signature or
// validity: callers verify the chain first. The SPIFFE ID is parsed with
// go-spiffe and must be spiffe://<td>/node/<id> with a valid trust domain
// and node id; it must be the only URI SAN, except that the legacy TPM AK
// URN (TPMAKURNPrefix) may stand beside it. ParseNodeCert refuses a CA
// certificate, a CommonName or Organization that disagrees with the SPIFFE
// ID, more than one role or site, and an AK named twice or malformed.
func ParseNodeCert(c *x509.Certificate) (NodeCertInfo, error) {
	var info NodeCertInfo
	if c == nil {
		return info, errors.New("parse node certificate: no certificate")
	}
	if c.IsCA {
		return info, errors.New("parse node certificate: certificate is a CA")
	}
	var spiffe *url.URL
	for _, u := range c.URIs {
		switch {
		case strings.EqualFold(u.Scheme, "spiffe"):
			if spiffe != nil {
				return info, errors.New("parse node certificate: more than one spiffe URI")
			}
			spiffe = u
		case isTPMAKURN(u):
			if info.TPMAKName != nil {
				return info, errors.New("parse node certificate: more than one TPM AK URN")
			}
			name, err := parseTPMAKURN(u)
			if err != nil {
				return info, fmt.Errorf("parse node certificate: %w", err)
			}
			info.TPMAKName, info.LegacyAKURN = name, true
		default:
			return info, fmt.Errorf("parse node certificate: URI SAN %q: a node certificate has its SPIFFE ID as its only URI SAN", capString(u.String()))
		}
	}
	for _, ext := range c.Extensions {
		if !ext.Id.Equal(OIDTPMAKName) {
			continue
		}
		if info.TPMAKName != nil {
			return info, errors.New("parse node certificate: the TPM AK is named twice")
		}
		name, err := parseTPMAKNameExtension(ext.Value)
		if err != nil {
			return info, fmt.Errorf("parse node certificate: %w", err)
		}
		info.TPMAKName = name
	}
	if spiffe == nil {
		return info, errors.New("parse node certificate: no spiffe URI")
	}
	td, id, err := parseNodeSPIFFEID(spiffe)
	if err != nil {
		return info, fmt.Errorf("parse node certificate: %w", err)
	}
	info.TrustDomain, info.NodeID, info.SPIFFEID = td, id, NodeSPIFFEID(td, id)
	if c.Subject.CommonName != id {
		return info, fmt.Errorf("parse node certificate: common name %q is not the node id %q", c.Subject.CommonName, id)
	}
	if len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != td {
		return info, fmt.Errorf("parse node certificate: organization %q is not the trust domain %q", c.Subject.Organization, td)
	}
	switch len(c.Subject.OrganizationalUnit) {
	case 0:
	case 1:
		info.Role = c.Subject.OrganizationalUnit[0]
	default:
		return info, fmt.Errorf("parse node certificate: %d roles, want at most one", len(c.Subject.OrganizationalUnit))
	}
	switch len(c.Subject.Locality) {
	case 0:
	case 1:
		info.Site = c.Subject.Locality[0]
	default:
		return info, fmt.Errorf("parse node certificate: %d sites, want at most one", len(c.Subject.Locality))
	}
	return info, nil
}

// parseNodeSPIFFEID parses spiffe://<td>/node/<id> with go-spiffe, refusing
// any other form (ports, user info, queries, fragments, other or extra path
// segments) and a trust domain or node id outside nodetrust's rules.
func parseNodeSPIFFEID(u *url.URL) (td, id string, err error) {
	s := capString(u.String())
	sid, err := spiffeid.FromURI(u)
	if err != nil {
		return "", "", fmt.Errorf("spiffe URI %q: %w", s, err)
	}
	td, id, ok := splitMemberID(sid, nodePath)
	if !ok {
		return "", "", fmt.Errorf("spiffe URI %q is not of the form spiffe://<trust-domain>/node/<node-id>", s)
	}
	if err := ValidTrustDomain(td); err != nil {
		return "", "", fmt.Errorf("spiffe URI %q: %w", s, err)
	}
	if err := ValidNodeID(id); err != nil {
		return "", "", fmt.Errorf("spiffe URI %q: %w", s, err)
	}
	return td, id, nil
}

// capString bounds a string from a certificate before it goes into an
// error message.
func capString(s string) string {
	const limit = 128
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}

func isTPMAKURN(u *url.URL) bool {
	return strings.EqualFold(u.Scheme, "urn") && strings.HasPrefix(strings.ToLower(u.Opaque), "nodetrust:tpm-ak:")
}

// parseTPMAKURN decodes the lower-case hex TPM name of a TPM AK URN.
func parseTPMAKURN(u *url.URL) ([]byte, error) {
	s := u.String()
	h, ok := strings.CutPrefix(s, TPMAKURNPrefix)
	if !ok || h == "" || len(h) > 2*maxTPMNameLen || strings.ToLower(h) != h {
		return nil, fmt.Errorf("TPM AK URN %q is not %s<lower-case hex>", capString(s), TPMAKURNPrefix)
	}
	name, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("TPM AK URN %q: %w", capString(s), err)
	}
	return name, nil
}

// AdminID returns the SPIFFE ID of an admin credential,
// spiffe://<trustDomain>/admin/<name>, built with go-spiffe after checking
// the trust domain and the name (which follows the node id rule).
func AdminID(trustDomain, name string) (spiffeid.ID, error) {
	return memberID(trustDomain, adminPath, name, "admin name", ValidNodeID)
}

// AdminIdentity returns the admin name of a client certificate whose only
// URI SAN is the SPIFFE ID spiffe://<trustDomain>/admin/<name> ("owner" for
// the credential [Init] makes), parsed with go-spiffe. It does not verify
// the certificate: the caller has verified it against the serving CA (the
// TLS handshake does).
func AdminIdentity(c *x509.Certificate, trustDomain string) (string, bool) {
	if c == nil || trustDomain == "" || len(c.URIs) != 1 {
		return "", false
	}
	id, err := spiffeid.FromURI(c.URIs[0])
	if err != nil {
		return "", false
	}
	td, name, ok := splitMemberID(id, adminPath)
	if !ok || td != trustDomain || ValidNodeID(name) != nil {
		return "", false
	}
	return name, true
}
