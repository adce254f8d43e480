package identity

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Version is the identity.json format this package writes and the only one
// LoadState reads.
const Version = 1

// Identity is the content of identity.json.
type Identity struct {
	Version     int    `json:"version"` // Version; 0 is written as Version
	NodeID      string `json:"node_id"`
	SPIFFEID    string `json:"spiffe_id"`
	TrustDomain string `json:"trust_domain"`
	Role        string `json:"role"`
	Site        string `json:"site,omitempty"`
	// Generation is the node's identity generation at the control plane; a
	// later generation keeps older certificates dead.
	Generation uint64 `json:"identity_generation"`
	Attestor   string `json:"attestor"`
	KeyKind    string `json:"key_kind"` // KeyKindFile or KeyKindTPM
	// Chain is the certificate chain as DER, leaf first (base64 in JSON).
	Chain [][]byte `json:"chain"`
	// Roots is the trust bundle as DER.
	Roots      [][]byte  `json:"roots"`
	ServerTime time.Time `json:"server_time"`
	JoinedAt   time.Time `json:"joined_at"`
	RenewedAt  time.Time `json:"renewed_at,omitzero"` // zero until the first renewal
	// TPMAK is the PEM record of the TPM attestation key the certificate
	// names (urn:nodetrust:tpm-ak:), after a certified tpm join; renewals
	// load it to certify the next key.
	TPMAK []byte `json:"tpm_ak,omitempty"`
}

// Key kinds of Identity.KeyKind.
const (
	KeyKindFile = "file"
	KeyKindTPM  = "tpm"
)

// Leaf parses and returns the first certificate of the chain, the node's own.
func (id *Identity) Leaf() (*x509.Certificate, error) {
	if len(id.Chain) == 0 {
		return nil, errors.New("the identity holds no certificate")
	}
	leaf, err := x509.ParseCertificate(id.Chain[0])
	if err != nil {
		return nil, fmt.Errorf("parse the node certificate: %w", err)
	}
	return leaf, nil
}

// State is a loaded identity: the files of Dir, parsed, with the node key
// ready to sign. Key's public key is Leaf's.
type State struct {
	Dir      string
	Identity Identity
	Leaf     *x509.Certificate   // Chain[0]
	Chain    []*x509.Certificate // the whole chain, leaf first
	Roots    []*x509.Certificate // the trust bundle
	Key      crypto.Signer
}

// marshal returns id as it is stored in identity.json.
func marshal(id Identity) ([]byte, error) {
	if id.Version == 0 {
		id.Version = Version
	}
	data, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode identity: %w", err)
	}
	return append(data, '\n'), nil
}

// parse decodes identity.json and its certificates. Its errors describe what
// is wrong with the content, for LoadState to wrap.
func parse(data []byte) (id Identity, chain, roots []*x509.Certificate, err error) {
	if err := json.Unmarshal(data, &id); err != nil {
		return Identity{}, nil, nil, err
	}
	if id.Version != Version {
		return Identity{}, nil, nil, fmt.Errorf("format version %d is not %d", id.Version, Version)
	}
	if id.NodeID == "" {
		return Identity{}, nil, nil, errors.New("no node_id")
	}
	if len(id.Chain) == 0 {
		return Identity{}, nil, nil, errors.New("no certificate")
	}
	for i, der := range id.Chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return Identity{}, nil, nil, fmt.Errorf("chain certificate %d: %w", i, err)
		}
		chain = append(chain, c)
	}
	for i, der := range id.Roots {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return Identity{}, nil, nil, fmt.Errorf("root certificate %d: %w", i, err)
		}
		roots = append(roots, c)
	}
	return id, chain, roots, nil
}

// validate checks what Persist and StoreRenewal need before they write.
func validate(id Identity, keyPEM []byte) error {
	if id.NodeID == "" {
		return errors.New("the identity has no node id")
	}
	if id.Version != 0 && id.Version != Version {
		return fmt.Errorf("identity format version %d is not %d", id.Version, Version)
	}
	if _, err := id.Leaf(); err != nil {
		return err
	}
	if len(keyPEM) == 0 {
		return errors.New("the node key is empty")
	}
	return nil
}
