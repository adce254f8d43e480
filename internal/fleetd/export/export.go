package export

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // SPIRE's x509pop and tpm_devid selectors name CAs by SHA-1 fingerprint
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
)

// Version is the document version Build writes and Parse reads.
const Version = 1

// MaxBytes bounds an export document Parse reads (about 2 KiB a device).
const MaxBytes = 64 << 20

// Attestor names of AgentMatch.
const (
	// AttestorX509PoP is SPIRE's x509pop node attestor presenting the
	// node certificate fleetd issued.
	AttestorX509PoP = "x509pop"
	// AttestorTPMDevID is SPIRE's tpm_devid node attestor presenting the
	// node certificate of a TPM join (an LDevID) from the node's TPM.
	AttestorTPMDevID = "tpm_devid"
)

// AgentMatch is one way a SPIRE agent on the device attests: the
// selectors (type:value, sorted) its node attestor gives it. A SPIRE
// registration with exactly these selectors, parented to the server,
// makes that agent the device's SPIFFE ID.
type AgentMatch struct {
	Attestor  string   `json:"attestor"`
	Selectors []string `json:"selectors"`
}

// Device is one machine of the export.
type Device struct {
	NodeID   string `json:"node_id"`
	SPIFFEID string `json:"spiffe_id"`
	State    string `json:"state"`
	// Generation is the node's identity generation.
	Generation uint64       `json:"generation"`
	Agents     []AgentMatch `json:"agents"`
}

// Document is the export: Devices are eligible (their registrations
// should exist), Retired are explicitly retired (their registrations go,
// their agents are banned on sight). Both are sorted by node id.
type Document struct {
	Version     int      `json:"version"`
	TrustDomain string   `json:"trust_domain"`
	Devices     []Device `json:"devices"`
	Retired     []Device `json:"retired"`
}

// Envelope is the document as served: the document's exact bytes and
// their digest ("sha256:" + hex).
type Envelope struct {
	Version  int             `json:"version"`
	Digest   string          `json:"digest"`
	Document json.RawMessage `json:"document"`
}

// Options say which nodes are eligible and how their agents attest.
type Options struct {
	TrustDomain string
	// NodeCA is the CA that issues node certificates: the x509pop and
	// tpm_devid selectors name it by fingerprint.
	NodeCA *x509.Certificate
	// EligibleStates are the states whose nodes are exported as
	// eligible (default: active only).
	EligibleStates []string
}

// DefaultEligibleStates are the states eligible by default.
var DefaultEligibleStates = []string{store.StateActive}

// Fingerprint is SPIRE's name for a CA in ca:fingerprint selectors: the
// lower-case hex SHA-1 of its DER.
func Fingerprint(c *x509.Certificate) string {
	sum := sha1.Sum(c.Raw) //nolint:gosec // the selector's own definition
	return hex.EncodeToString(sum[:])
}

// Build makes the export of nodes: the eligible ones and the retired ones,
// sorted by node id; other nodes are left out. It returns the envelope's
// JSON and the digest.
func Build(nodes []store.Node, o Options) ([]byte, string, error) {
	if o.TrustDomain == "" || o.NodeCA == nil {
		return nil, "", errors.New("build export: the trust domain and the node CA are required")
	}
	eligible := o.EligibleStates
	if len(eligible) == 0 {
		eligible = DefaultEligibleStates
	}
	doc := Document{Version: Version, TrustDomain: o.TrustDomain, Devices: []Device{}, Retired: []Device{}}
	fp := Fingerprint(o.NodeCA)
	for _, n := range nodes {
		retired := n.State == store.StateRetired
		if !retired && !slices.Contains(eligible, n.State) {
			continue
		}
		spiffeID := n.SPIFFEID
		if spiffeID == "" {
			spiffeID = pki.NodeSPIFFEID(o.TrustDomain, n.ID)
		}
		d := Device{NodeID: n.ID, SPIFFEID: spiffeID, State: n.State, Generation: n.Generation, Agents: agentsOf(n, fp)}
		if retired {
			doc.Retired = append(doc.Retired, d)
		} else {
			doc.Devices = append(doc.Devices, d)
		}
	}
	byID := func(a, b Device) int { return strings.Compare(a.NodeID, b.NodeID) }
	slices.SortFunc(doc.Devices, byID)
	slices.SortFunc(doc.Retired, byID)
	body, err := json.Marshal(doc)
	if err != nil {
		return nil, "", fmt.Errorf("build export: %w", err)
	}
	digest := Digest(body)
	env, err := json.Marshal(Envelope{Version: Version, Digest: digest, Document: body})
	if err != nil {
		return nil, "", fmt.Errorf("build export: %w", err)
	}
	return env, digest, nil
}

// agentsOf are the selectors SPIRE's node attestors give n's agent: the
// x509pop attestor with the node certificate (subject CN = node id,
// issued by the node CA), and for a node that proved its TPM, tpm_devid
// with the same certificate from the TPM.
func agentsOf(n store.Node, caFingerprint string) []AgentMatch {
	sel := func(attestor string) AgentMatch {
		return AgentMatch{Attestor: attestor, Selectors: []string{
			attestor + ":ca:fingerprint:" + caFingerprint,
			attestor + ":subject:cn:" + n.ID,
		}}
	}
	out := []AgentMatch{sel(AttestorX509PoP)}
	if n.EKPin != "" {
		out = append(out, sel(AttestorTPMDevID))
	}
	return out
}

// Digest is "sha256:" + the lower-case hex SHA-256 of a document's bytes.
func Digest(document []byte) string {
	sum := sha256.Sum256(document)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ErrMalformed is an export that cannot be read or fails a check;
// ErrUnverifiable one whose digest does not match its document. errors.Is
// finds them in what Parse returns.
var (
	ErrMalformed    = errors.New("malformed export")
	ErrUnverifiable = errors.New("unverifiable export")
)

// Parse reads an envelope, checks its digest against the document's exact
// bytes and the document itself, and returns the document and digest.
// trustDomain, when not empty, is the trust domain the document must name.
func Parse(data []byte, trustDomain string) (Document, string, error) {
	if len(data) > MaxBytes {
		return Document{}, "", fmt.Errorf("%w: larger than %d bytes", ErrMalformed, MaxBytes)
	}
	var env Envelope
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return Document{}, "", fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if env.Version != Version {
		return Document{}, "", fmt.Errorf("%w: version %d (this fleetd reads version %d)", ErrMalformed, env.Version, Version)
	}
	if len(env.Document) == 0 {
		return Document{}, "", fmt.Errorf("%w: no document", ErrMalformed)
	}
	if got := Digest(env.Document); got != env.Digest {
		return Document{}, "", fmt.Errorf("%w: digest %q does not match the document (%s)", ErrUnverifiable, env.Digest, got)
	}
	var doc Document
	dec = json.NewDecoder(bytes.NewReader(env.Document))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return Document{}, "", fmt.Errorf("%w: document: %v", ErrMalformed, err)
	}
	if err := doc.check(trustDomain); err != nil {
		return Document{}, "", fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return doc, env.Digest, nil
}

// check refuses a document whose fields do not make sense.
func (d Document) check(trustDomain string) error {
	if d.Version != Version {
		return fmt.Errorf("document version %d", d.Version)
	}
	if d.TrustDomain == "" || (trustDomain != "" && d.TrustDomain != trustDomain) {
		return fmt.Errorf("trust domain %q, expected %q", d.TrustDomain, trustDomain)
	}
	if d.Devices == nil || d.Retired == nil {
		return errors.New("the devices and retired lists must be present (empty lists are [])")
	}
	seen := map[string]bool{}
	for _, list := range [][]Device{d.Devices, d.Retired} {
		for _, dev := range list {
			if err := pki.ValidNodeID(dev.NodeID); err != nil {
				return fmt.Errorf("device %q: %v", dev.NodeID, err)
			}
			if seen[dev.NodeID] {
				return fmt.Errorf("device %s is listed twice", dev.NodeID)
			}
			seen[dev.NodeID] = true
			if want := pki.NodeSPIFFEID(d.TrustDomain, dev.NodeID); dev.SPIFFEID != want {
				return fmt.Errorf("device %s: SPIFFE ID %q, expected %q", dev.NodeID, dev.SPIFFEID, want)
			}
			if len(dev.Agents) == 0 {
				return fmt.Errorf("device %s: no agent selectors", dev.NodeID)
			}
			for _, a := range dev.Agents {
				if a.Attestor != AttestorX509PoP && a.Attestor != AttestorTPMDevID {
					return fmt.Errorf("device %s: attestor %q is not %s or %s", dev.NodeID, a.Attestor, AttestorX509PoP, AttestorTPMDevID)
				}
				if len(a.Selectors) == 0 {
					return fmt.Errorf("device %s: %s without selectors", dev.NodeID, a.Attestor)
				}
				for _, s := range a.Selectors {
					if !strings.HasPrefix(s, a.Attestor+":") || len(s) > 512 {
						return fmt.Errorf("device %s: selector %q is not an %s selector", dev.NodeID, s, a.Attestor)
					}
				}
			}
		}
	}
	return nil
}
