package pki

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Limits of identifiers.
const (
	// MaxTrustDomainLen is the SPIFFE limit on a trust domain name.
	MaxTrustDomainLen = 255
	// MaxNodeIDLen is the longest node id.
	MaxNodeIDLen = 63
)

// ValidTrustDomain checks a SPIFFE trust domain name: 1 to 255 characters,
// each a lower-case ASCII letter, a digit, '.', '-' or '_'.
func ValidTrustDomain(td string) error {
	if td == "" {
		return errors.New("trust domain is empty")
	}
	if len(td) > MaxTrustDomainLen {
		return fmt.Errorf("trust domain is %d characters, more than %d", len(td), MaxTrustDomainLen)
	}
	for i := 0; i < len(td); i++ {
		c := td[i]
		if !isLowerAlnum(c) && c != '.' && c != '-' && c != '_' {
			return fmt.Errorf("trust domain %q: character %q at offset %d is not allowed (lower-case letters, digits, '.', '-', '_')", td, c, i)
		}
	}
	return nil
}

// ValidNodeID checks a node id: 1 to 63 characters, a lower-case ASCII
// letter or digit first, then lower-case letters, digits, '.', '_' or '-'
// (the pattern ^[a-z0-9][a-z0-9._-]{0,62}$).
func ValidNodeID(id string) error {
	if id == "" {
		return errors.New("node id is empty")
	}
	if len(id) > MaxNodeIDLen {
		return fmt.Errorf("node id is %d characters, more than %d", len(id), MaxNodeIDLen)
	}
	if !isLowerAlnum(id[0]) {
		return fmt.Errorf("node id %q must start with a lower-case letter or a digit", id)
	}
	for i := 1; i < len(id); i++ {
		c := id[i]
		if !isLowerAlnum(c) && c != '.' && c != '-' && c != '_' {
			return fmt.Errorf("node id %q: character %q at offset %d is not allowed (lower-case letters, digits, '.', '-', '_')", id, c, i)
		}
	}
	return nil
}

func isLowerAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

// NodeSPIFFEID returns the node's SPIFFE ID, "spiffe://<trustDomain>/node/<nodeID>",
// built with go-spiffe's spiffeid package. It returns "" when trustDomain
// or nodeID is not valid ([ValidTrustDomain], [ValidNodeID]), so a caller
// comparing IDs never matches an invalid one.
func NodeSPIFFEID(trustDomain, nodeID string) string {
	id, err := NodeID(trustDomain, nodeID)
	if err != nil {
		return ""
	}
	return id.String()
}

// NodeID returns the node's SPIFFE ID spiffe://<trustDomain>/node/<nodeID>
// after checking both parts with [ValidTrustDomain] and [ValidNodeID].
func NodeID(trustDomain, nodeID string) (spiffeid.ID, error) {
	return memberID(trustDomain, nodePath, nodeID, "node id", ValidNodeID)
}

// The first path segment of the SPIFFE IDs nodetrust issues.
const (
	nodePath  = "node"
	adminPath = "admin"
)

// memberID builds spiffe://<trustDomain>/<kind>/<name> with go-spiffe,
// after checking the trust domain and the name with valid.
func memberID(trustDomain, kind, name, what string, valid func(string) error) (spiffeid.ID, error) {
	if err := ValidTrustDomain(trustDomain); err != nil {
		return spiffeid.ID{}, err
	}
	if err := valid(name); err != nil {
		return spiffeid.ID{}, err
	}
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	id, err := spiffeid.FromSegments(td, kind, name)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("%s %q: %w", what, name, err)
	}
	return id, nil
}

// splitMemberID splits a SPIFFE ID of the form spiffe://<td>/<kind>/<name>
// (parsed by go-spiffe) into its trust domain and name, refusing another
// kind or any other number of path segments.
func splitMemberID(id spiffeid.ID, kind string) (td, name string, ok bool) {
	rest, found := strings.CutPrefix(id.Path(), "/"+kind+"/")
	if !found || rest == "" || strings.Contains(rest, "/") {
		return "", "", false
	}
	return id.TrustDomain().Name(), rest, true
}
