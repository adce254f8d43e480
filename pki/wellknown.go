package pki

import "encoding/json"

// WellKnown is the control plane's /.well-known/nodetrust.json document
// (also returned by JoinService.GetWellKnown). A machine that bootstraps
// from it trusts it only after checking its pins against the ones its
// operator gave, and the JWK against join_encryption_key_pin.
type WellKnown struct {
	Version              int             `json:"version"`
	TrustDomain          string          `json:"trust_domain"`
	ServerName           string          `json:"server_name"`
	ServingCASPKIPin     string          `json:"serving_ca_spki_pin"`
	JoinSigningKeyPin    string          `json:"join_signing_key_pin"`
	JoinEncryptionKeyPin string          `json:"join_encryption_key_pin"`
	JoinEncryptionJWK    json.RawMessage `json:"join_encryption_jwk"`
	// Servers are the gRPC addresses (host:port) of the control plane's
	// replicas, for nodes to move between when one is down; empty when
	// the operator named none (fleetd.toml advertise_addresses).
	Servers []string `json:"servers,omitempty"`
}
