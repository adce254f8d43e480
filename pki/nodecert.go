package pki

import (
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

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
}

// ParseNodeCert reads the identity from a node certificate made by
// [Issuer.Issue]. It does not verify the certificate's signature or
// validity: callers verify the chain first. It refuses a certificate with
// no spiffe URI, more than one, one that is not spiffe://<td>/node/<id>
// with a valid trust domain and node id, a CommonName or Organization that
// disagrees with it, more than one role, site or TPM AK URN, or a CA
// certificate. URIs of other schemes are ignored.
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
			info.TPMAKName = name
		}
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

// parseNodeSPIFFEID splits spiffe://<td>/node/<id>, refusing any other form
// (ports, user info, queries, fragments, extra path segments).
func parseNodeSPIFFEID(u *url.URL) (td, id string, err error) {
	s := u.String()
	td = u.Host
	if err := ValidTrustDomain(td); err != nil {
		return "", "", fmt.Errorf("spiffe URI %q: %w", s, err)
	}
	id, ok := strings.CutPrefix(u.Path, "/node/")
	if !ok {
		return "", "", fmt.Errorf("spiffe URI %q is not a node SPIFFE ID", s)
	}
	if err := ValidNodeID(id); err != nil {
		return "", "", fmt.Errorf("spiffe URI %q: %w", s, err)
	}
	if s != NodeSPIFFEID(td, id) {
		return "", "", fmt.Errorf("spiffe URI %q is not of the form spiffe://<trust-domain>/node/<node-id>", s)
	}
	return td, id, nil
}

func isTPMAKURN(u *url.URL) bool {
	return strings.EqualFold(u.Scheme, "urn") && strings.HasPrefix(strings.ToLower(u.Opaque), "nodetrust:tpm-ak:")
}

// parseTPMAKURN decodes the lower-case hex TPM name of a TPM AK URN.
func parseTPMAKURN(u *url.URL) ([]byte, error) {
	s := u.String()
	h, ok := strings.CutPrefix(s, TPMAKURNPrefix)
	if !ok || h == "" || len(h) > 2*maxTPMNameLen || strings.ToLower(h) != h {
		return nil, fmt.Errorf("TPM AK URN %q is not %s<lower-case hex>", s, TPMAKURNPrefix)
	}
	name, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("TPM AK URN %q: %w", s, err)
	}
	return name, nil
}

// AdminIdentity returns the admin name of a client certificate whose only
// spiffe URI is spiffe://<trustDomain>/admin/<name> ("owner" for the
// credential [Init] makes). It does not verify the certificate: the caller
// has verified it against the serving CA (the TLS handshake does).
func AdminIdentity(c *x509.Certificate, trustDomain string) (string, bool) {
	if c == nil || trustDomain == "" {
		return "", false
	}
	var found string
	n := 0
	for _, u := range c.URIs {
		if !strings.EqualFold(u.Scheme, "spiffe") {
			continue
		}
		n++
		found = u.String()
	}
	if n != 1 {
		return "", false
	}
	name, ok := strings.CutPrefix(found, adminSPIFFEID(trustDomain, ""))
	if !ok || ValidNodeID(name) != nil {
		return "", false
	}
	return name, true
}
