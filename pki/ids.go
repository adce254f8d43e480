package pki

import (
	"errors"
	"fmt"
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

// NodeSPIFFEID returns "spiffe://<trustDomain>/node/<nodeID>". It does not
// validate its arguments; callers check them with [ValidTrustDomain] and
// [ValidNodeID].
func NodeSPIFFEID(trustDomain, nodeID string) string {
	return "spiffe://" + trustDomain + "/node/" + nodeID
}

// adminSPIFFEID returns "spiffe://<trustDomain>/admin/<name>".
func adminSPIFFEID(trustDomain, name string) string {
	return "spiffe://" + trustDomain + "/admin/" + name
}
