package callsig

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/pki"
)

// DefaultMaxProofEntries is the default cap of a [ProofCache]: the machine
// proofs of this many distinct senders of other machines. Each entry holds
// the proof's hash, the peer and its validity, some 200 bytes.
const DefaultMaxProofEntries = 4096

// ProofCache remembers the machine proofs that [VerifyMachineProof]
// accepted, keyed by the SHA-256 of their wire encoding, so that the next
// call of the same sender of the same machine costs a hash and a map look-up
// instead of a chain verification and two signature checks. It is safe for
// concurrent use.
//
// An entry serves only the same proof bytes, against the same trust bundle
// (the same *x509.CertPool and trust domain) and namespace, and only while
// every certificate of the verified chain is valid: from the latest
// NotBefore to the earliest NotAfter of the chain, root included. Anything
// else is verified again in full. [ProofCache.RevokeCert] records that a
// node certificate was revoked, for a daemon that learns it (fleetd's
// revocation feed): the node's entries are dropped and, from then on, proofs
// whose leaf is that certificate are refused, cached or not — without it, a
// revoked certificate that has not expired would pass the full verification
// again, which checks no revocation. [ProofCache.ForgetNode] only drops the
// entries of a node. A daemon that renews its trust bundle
// gets a new pool and so misses every entry made against the old one.
//
// The cache is bounded: when it holds its cap, an expired entry or else the
// oldest one makes room. A hostile peer can therefore only evict entries
// (making calls cost their full verification again), not grow memory.
type ProofCache struct {
	max int

	mu      sync.Mutex
	entries map[[sha256.Size]byte]*proofEntry
	order   [][sha256.Size]byte // insertion order, oldest first, for eviction
	hits    uint64
	misses  uint64
	// revoked maps the serial (pki.SerialHex) of a revoked leaf to when
	// the record can go: the leaf's expiry.
	revoked map[string]time.Time
}

// MaxRevokedCerts bounds the revoked certificates a [ProofCache]
// remembers. When it holds this many, the expired ones are dropped, and
// else the one that expires first.
const MaxRevokedCerts = 65536

// RevocationMemory is how long a [ProofCache] remembers a revoked
// certificate whose expiry it was not told: a node certificate lives at
// most 24 hours; the extra hour covers clocks a little apart.
const RevocationMemory = 25 * time.Hour

type proofEntry struct {
	roots       *x509.CertPool
	trustDomain string
	namespace   string
	notBefore   time.Time
	notAfter    time.Time
	// leafSerial is the serial (pki.SerialHex) of the leaf, the node's
	// certificate.
	leafSerial string
	peer       Peer
}

// NewProofCache returns a cache of at most maxEntries proofs; zero or less
// means [DefaultMaxProofEntries].
func NewProofCache(maxEntries int) *ProofCache {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxProofEntries
	}
	return &ProofCache{max: maxEntries, entries: make(map[[sha256.Size]byte]*proofEntry), revoked: make(map[string]time.Time)}
}

// Verify returns the peer that the machine proof encoded in data proves, as
// [VerifyMachineProof] does for the decoded proof (empty data meaning no
// proof), from the cache when the same bytes were accepted before under the
// same trust and namespace and the chain is valid at now (zero means
// time.Now()). A proof that does not decode is refused with a [*Rejection]
// of check [CheckMachineProof] wrapping [ErrMalformed]. Refused proofs are
// not remembered.
func (c *ProofCache) Verify(data []byte, trust TrustBundle, namespace string, now time.Time) (*Peer, error) {
	if now.IsZero() {
		now = time.Now()
	}
	var key [sha256.Size]byte
	if len(data) > 0 && len(data) <= MaxMachineProofLen {
		key = sha256.Sum256(data)
		c.mu.Lock()
		e := c.entries[key]
		if e != nil && e.roots == trust.Roots && trust.Roots != nil && e.trustDomain == trust.TrustDomain &&
			e.namespace == namespace && !now.Before(e.notBefore) && !now.After(e.notAfter) {
			if err := c.revokedLocked(e.peer.NodeID, e.leafSerial); err != nil {
				c.mu.Unlock()
				return nil, err
			}
			c.hits++
			p := e.peer
			c.mu.Unlock()
			p.SenderKey = append(ed25519.PublicKey(nil), p.SenderKey...)
			return &p, nil
		}
		c.misses++
		c.mu.Unlock()
	}
	var proof *MachineProof
	if len(data) > 0 {
		proof = new(MachineProof)
		if err := proof.UnmarshalBinary(data); err != nil {
			return nil, rejectCause(err, CheckMachineProof, "the proof does not decode: %v", err)
		}
	}
	peer, chain, err := verifyMachineProof(proof, trust, namespace, now)
	if err != nil {
		return nil, err
	}
	e := &proofEntry{roots: trust.Roots, trustDomain: trust.TrustDomain, namespace: namespace, peer: *peer}
	e.peer.SenderKey = append(ed25519.PublicKey(nil), peer.SenderKey...)
	e.notBefore, e.notAfter = chainValidity(chain)
	e.leafSerial = pki.SerialHex(chain[0])
	c.mu.Lock()
	err = c.revokedLocked(peer.NodeID, e.leafSerial)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	c.add(key, e, now)
	return peer, nil
}

// revokedLocked refuses a proof of node nodeID whose leaf has serial
// serial when that certificate was revoked. c.mu is held.
func (c *ProofCache) revokedLocked(nodeID, serial string) error {
	if _, ok := c.revoked[serial]; !ok {
		return nil
	}
	return reject(CheckMachineProof, "the certificate of node %s (serial %s) was revoked: the node needs a new certificate", nodeID, serial)
}

// chainValidity returns the span in which every certificate of chain is
// valid.
func chainValidity(chain []*x509.Certificate) (notBefore, notAfter time.Time) {
	for i, cert := range chain {
		if i == 0 || cert.NotBefore.After(notBefore) {
			notBefore = cert.NotBefore
		}
		if i == 0 || cert.NotAfter.Before(notAfter) {
			notAfter = cert.NotAfter
		}
	}
	return notBefore, notAfter
}

// add remembers e under key, making room when the cache is full.
func (c *ProofCache) add(key [sha256.Size]byte, e *proofEntry, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; ok {
		c.entries[key] = e
		return
	}
	if len(c.entries) >= c.max {
		c.evict(now)
	}
	c.entries[key] = e
	c.order = append(c.order, key)
}

// evict drops the expired entries, or else the oldest one, and compacts
// the insertion order of keys dropped earlier by ForgetNode.
func (c *ProofCache) evict(now time.Time) {
	kept := c.order[:0]
	for _, k := range c.order {
		if e, ok := c.entries[k]; ok && !now.After(e.notAfter) {
			kept = append(kept, k)
		} else {
			delete(c.entries, k)
		}
	}
	clear(c.order[len(kept):])
	c.order = kept
	if len(c.entries) >= c.max && len(c.order) > 0 {
		delete(c.entries, c.order[0])
		c.order = c.order[1:]
	}
}

// ForgetNode drops every proof of node nodeID, so that its next call is
// verified in full. A daemon calls it when it learns that the node was
// revoked.
func (c *ProofCache) ForgetNode(nodeID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.entries {
		if e.peer.NodeID == nodeID {
			delete(c.entries, k)
		}
	}
	kept := c.order[:0]
	for _, k := range c.order {
		if _, ok := c.entries[k]; ok {
			kept = append(kept, k)
		}
	}
	clear(c.order[len(kept):])
	c.order = kept
}

// RevokeCert records that the certificate of node nodeID with serial
// serial (lower-case hex of its bytes, as pki.SerialHex) was revoked: it
// drops the node's proofs, and refuses the proofs whose leaf is that
// certificate, until notAfter, its expiry (zero means RevocationMemory
// after now, which zero makes time.Now()). The node's other certificates,
// such as one it got after the revocation, are served as before.
func (c *ProofCache) RevokeCert(nodeID, serial string, notAfter, now time.Time) {
	if now.IsZero() {
		now = time.Now()
	}
	if notAfter.IsZero() {
		notAfter = now.Add(RevocationMemory)
	}
	c.mu.Lock()
	if _, ok := c.revoked[serial]; !ok && len(c.revoked) >= MaxRevokedCerts {
		c.pruneRevokedLocked(now)
	}
	if until, ok := c.revoked[serial]; !ok || notAfter.After(until) {
		c.revoked[serial] = notAfter
	}
	c.mu.Unlock()
	c.ForgetNode(nodeID)
}

// pruneRevokedLocked drops the records of expired certificates, or else
// the one that expires first. c.mu is held.
func (c *ProofCache) pruneRevokedLocked(now time.Time) {
	var first string
	for serial, until := range c.revoked {
		if now.After(until) {
			delete(c.revoked, serial)
			continue
		}
		if first == "" || until.Before(c.revoked[first]) {
			first = serial
		}
	}
	if len(c.revoked) >= MaxRevokedCerts && first != "" {
		delete(c.revoked, first)
	}
}

// ProofCacheStats describes a ProofCache, for metrics and status reports.
type ProofCacheStats struct {
	Entries    int
	MaxEntries int
	// RevokedCerts is the number of revoked certificates remembered.
	RevokedCerts int
	// Hits and Misses count the look-ups since the cache was made.
	Hits, Misses uint64
}

// Stats describes the cache.
func (c *ProofCache) Stats() ProofCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ProofCacheStats{Entries: len(c.entries), MaxEntries: c.max, RevokedCerts: len(c.revoked), Hits: c.hits, Misses: c.misses}
}
