package federation

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/pki"
)

// ErrNoCertificate means the daemon has no machine certificate (or no CA to
// check other machines against), so it takes no call of another machine
// and cannot prove its own.
var ErrNoCertificate = errors.New("this daemon has no machine certificate")

// ErrNotEndorsed means the boot has not endorsed the sender's key.
var ErrNotEndorsed = errors.New("sender not endorsed")

// refreshEvery is how often, at most, a Machine looks for a renewed
// certificate.
const refreshEvery = time.Second

// Config configures New.
type Config struct {
	// Namespace is the daemon's namespace. Required.
	Namespace string
	// State is the identity loaded at start, shared with its owner (the
	// agent): New signs the boot statement with its key and never closes
	// it. It keeps a file key; a key that holds a resource (an io.Closer,
	// such as a TPM key) it loads again from Dir when it needs it, and
	// releases after each use. Nil makes a Machine with no machine
	// certificate, of node NodeID.
	State *identity.State
	// NodeID is the node id when State is nil.
	NodeID string
	// Dir is the data directory from which a renewed certificate is read;
	// empty means the certificate is never reloaded.
	Dir string
	// LoadKey turns the bytes of node.key into a signer; nil means
	// identity.LoadPKCS8Key.
	LoadKey identity.KeyLoader
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// creds are the machine credentials of one certificate.
type creds struct {
	nodeID      string
	trustDomain string
	leaf        *x509.Certificate
	chain       [][]byte // DER, leaf first
	roots       *x509.CertPool
	statement   callsig.BootStatement
	tlsCert     *tls.Certificate
	stamp       fileStamp

	mu sync.Mutex
	// key is the node key when holding it costs nothing (a file key). A
	// key that holds a resource (a TPM key: a TPM without a resource
	// manager holds few objects) is nil here: it is loaded from the data
	// directory for each use and released.
	key   crypto.Signer
	stSig []byte // the statement's signature; nil until signed
}

// fileStamp tells one identity.json from the next. The identity is
// written atomically (a new file renamed over the old), so a renewal gives
// it a new inode even when it lands within the file system's timestamp
// granularity with the same size.
type fileStamp struct {
	mod   time.Time
	size  int64
	inode uint64
}

type endorsement struct {
	key ed25519.PublicKey
	sig []byte
}

// Machine is a daemon's machine credentials for one boot. It is safe for
// concurrent use.
type Machine struct {
	namespace string
	nodeID    string
	bootID    string
	bootKey   ed25519.PrivateKey
	dir       string
	load      identity.KeyLoader
	now       func() time.Time

	mu          sync.RWMutex
	cur         *creds // nil: no machine certificate
	lastRefresh time.Time
	endorsed    map[string]endorsement
	// wire holds each sender's proof encoded, for the credentials it was
	// made with; Endorse and Forget drop a sender's, a renewal makes all
	// stale.
	wire map[string]wireProof
}

type wireProof struct {
	c *creds
	b []byte
}

// New makes the boot key and boot id and, when cfg.State holds a
// certificate and roots, signs the boot statement with the node key.
func New(cfg Config) (*Machine, error) {
	if cfg.Namespace == "" {
		return nil, errors.New("new machine credentials: no namespace")
	}
	_, bootKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make the boot key: %w", err)
	}
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("make the boot id: %w", err)
	}
	m := &Machine{
		namespace: cfg.Namespace,
		nodeID:    cfg.NodeID,
		bootID:    "boot-" + hex.EncodeToString(id),
		bootKey:   bootKey,
		dir:       cfg.Dir,
		load:      cfg.LoadKey,
		now:       cfg.Now,
		endorsed:  map[string]endorsement{},
		wire:      map[string]wireProof{},
	}
	if m.load == nil {
		m.load = identity.LoadPKCS8Key
	}
	if m.now == nil {
		m.now = time.Now
	}
	if cfg.State == nil {
		if err := pki.ValidNodeID(cfg.NodeID); err != nil {
			return nil, fmt.Errorf("new machine credentials: %w", err)
		}
		return m, nil
	}
	var stamp fileStamp
	if m.dir != "" {
		stamp, _ = statIdentity(m.dir)
	}
	key := cfg.State.Key
	c, err := m.newCreds(cfg.State.Identity.NodeID, cfg.State.Leaf, cfg.State.Chain, cfg.State.Roots, stamp)
	if err == nil {
		// The statement of the boot is signed at boot.
		if c.stSig, err = c.statement.Sign(key); err != nil {
			err = fmt.Errorf("sign the boot statement with the node key: %w", err)
		}
	}
	// The key stays its owner's (the agent's, which closes it after a
	// renewal): a key that holds a resource is loaded again from Dir when
	// needed, a file key costs nothing to keep.
	if _, holds := key.(io.Closer); !holds && err == nil && len(cfg.State.Roots) > 0 {
		c.key = key
	}
	if err != nil {
		return nil, err
	}
	m.nodeID = c.nodeID
	if len(cfg.State.Roots) > 0 {
		m.cur = c
	}
	m.lastRefresh = m.now()
	return m, nil
}

// newCreds makes the credentials of one certificate, with the statement
// not yet signed.
func (m *Machine) newCreds(nodeID string, leaf *x509.Certificate, chain, roots []*x509.Certificate, stamp fileStamp) (*creds, error) {
	info, err := pki.ParseNodeCert(leaf)
	if err != nil {
		return nil, fmt.Errorf("read the machine certificate: %w", err)
	}
	if info.NodeID != nodeID {
		return nil, fmt.Errorf("the machine certificate is node %q, the identity %q", info.NodeID, nodeID)
	}
	c := &creds{nodeID: info.NodeID, trustDomain: info.TrustDomain, leaf: leaf, roots: x509.NewCertPool(), stamp: stamp}
	for _, cert := range chain {
		c.chain = append(c.chain, cert.Raw)
	}
	for _, r := range roots {
		c.roots.AddCert(r)
	}
	c.statement = callsig.BootStatement{Namespace: m.namespace, NodeID: info.NodeID, BootID: m.bootID, BootPublicKey: m.bootKey.Public().(ed25519.PublicKey)}
	c.tlsCert = &tls.Certificate{Certificate: c.chain, PrivateKey: leafSigner{m: m, c: c}, Leaf: leaf}
	return c, nil
}

// withKey calls fn with the node key of c: the one c holds, or one loaded
// from the data directory (and released afterwards when it holds a
// resource).
func (m *Machine) withKey(c *creds, fn func(crypto.Signer) error) error {
	c.mu.Lock()
	key := c.key
	c.mu.Unlock()
	if key != nil {
		return fn(key)
	}
	if m.dir == "" {
		return errors.New("the node key is released, and there is no data directory to load it from")
	}
	key, err := identity.ReadKey(m.dir, c.leaf, m.load)
	if err != nil {
		return err
	}
	if _, holds := key.(io.Closer); holds {
		defer identity.CloseSigner(key)
	} else {
		c.mu.Lock()
		c.key = key
		c.mu.Unlock()
	}
	return fn(key)
}

// statementSig returns the signature of c's boot statement, signing it
// the first time.
func (m *Machine) statementSig(c *creds) ([]byte, error) {
	c.mu.Lock()
	sig := c.stSig
	c.mu.Unlock()
	if sig != nil {
		return sig, nil
	}
	err := m.withKey(c, func(k crypto.Signer) error {
		var err error
		sig, err = c.statement.Sign(k)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sign the boot statement with the node key: %w", err)
	}
	c.mu.Lock()
	c.stSig = sig
	c.mu.Unlock()
	return sig, nil
}

// leafSigner signs TLS handshakes with the node key of one certificate.
type leafSigner struct {
	m *Machine
	c *creds
}

func (s leafSigner) Public() crypto.PublicKey { return s.c.leaf.PublicKey }

func (s leafSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) (sig []byte, err error) {
	err = s.m.withKey(s.c, func(k crypto.Signer) error {
		sig, err = k.Sign(r, digest, opts)
		return err
	})
	return sig, err
}

// BootID returns the instance id of this boot.
func (m *Machine) BootID() string { return m.bootID }

// BootPublicKey returns the boot's public key.
func (m *Machine) BootPublicKey() ed25519.PublicKey { return m.bootKey.Public().(ed25519.PublicKey) }

// NodeID returns the daemon's node id.
func (m *Machine) NodeID() string { return m.nodeID }

// Namespace returns the daemon's namespace.
func (m *Machine) Namespace() string { return m.namespace }

// Certificate returns the current machine certificate, or nil.
func (m *Machine) Certificate() *x509.Certificate {
	if c := m.current(); c != nil {
		return c.leaf
	}
	return nil
}

// TrustDomain returns the trust domain of the machine certificate, or "".
func (m *Machine) TrustDomain() string {
	if c := m.current(); c != nil {
		return c.trustDomain
	}
	return ""
}

// Trust returns the bundle against which the daemon checks the machine
// proofs of other machines: the roots and trust domain of its identity.
// It is empty, refusing every proof, when the daemon has no machine
// certificate.
func (m *Machine) Trust() callsig.TrustBundle {
	c := m.current()
	if c == nil {
		return callsig.TrustBundle{}
	}
	return callsig.TrustBundle{Roots: c.roots, TrustDomain: c.trustDomain}
}

// Endorse signs, with the boot key, the endorsement of sender's key, and
// keeps it for the proofs of sender's calls.
func (m *Machine) Endorse(sender string, key ed25519.PublicKey) error {
	e := callsig.Endorsement{Namespace: m.namespace, NodeID: m.nodeID, BootID: m.bootID, Sender: sender, SenderKey: key}
	sig, err := e.Sign(m.bootKey)
	if err != nil {
		return fmt.Errorf("endorse %s: %w", sender, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.endorsed[sender] = endorsement{key: append(ed25519.PublicKey(nil), key...), sig: sig}
	delete(m.wire, sender)
	return nil
}

// Forget drops the endorsement of sender, if it endorses key.
func (m *Machine) Forget(sender string, key ed25519.PublicKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.endorsed[sender]; ok && e.key.Equal(key) {
		delete(m.endorsed, sender)
		delete(m.wire, sender)
	}
}

// Proof returns the machine proof of a call of sender to another machine.
func (m *Machine) Proof(sender string) (*callsig.MachineProof, error) {
	c := m.current()
	if c == nil {
		return nil, fmt.Errorf("%w, so other machines refuse its calls", ErrNoCertificate)
	}
	m.mu.RLock()
	e, ok := m.endorsed[sender]
	m.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: this boot of the daemon endorses no key of sender %q", ErrNotEndorsed, sender)
	}
	stSig, err := m.statementSig(c)
	if err != nil {
		return nil, err
	}
	return &callsig.MachineProof{
		Chain:     c.chain,
		Statement: c.statement, StatementSig: stSig,
		Endorsement:    callsig.Endorsement{Namespace: m.namespace, NodeID: m.nodeID, BootID: m.bootID, Sender: sender, SenderKey: e.key},
		EndorsementSig: e.sig,
	}, nil
}

// ProofBytes returns the wire encoding of Proof(sender). The encoding is
// made once per sender and certificate, and kept until the sender's
// endorsement changes or the certificate renews: a relayed call costs a
// map look-up, not a new proof. The caller must not modify the bytes.
func (m *Machine) ProofBytes(sender string) ([]byte, error) {
	c := m.current()
	m.mu.RLock()
	w, ok := m.wire[sender]
	m.mu.RUnlock()
	if ok && c != nil && w.c == c {
		return w.b, nil
	}
	p, err := m.Proof(sender)
	if err != nil {
		return nil, err
	}
	b, err := p.MarshalBinary()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Keep it only if nothing changed meanwhile: the same credentials and
	// the same endorsement.
	if e, ok := m.endorsed[sender]; ok && m.cur == c && e.key.Equal(p.Endorsement.SenderKey) {
		if len(m.wire) >= len(m.endorsed)+1 {
			clear(m.wire) // only stale entries can exceed the endorsements
		}
		m.wire[sender] = wireProof{c: c, b: b}
	}
	return b, nil
}

// current returns the credentials after looking, at most once a second,
// for a renewed certificate. A renewal that cannot be read yet keeps the
// current credentials; the next look tries again.
func (m *Machine) current() *creds {
	m.mu.RLock()
	c, last := m.cur, m.lastRefresh
	m.mu.RUnlock()
	if c == nil || m.dir == "" || m.now().Sub(last) < refreshEvery {
		return c
	}
	_, _ = m.Refresh()
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.cur
}

// Refresh reads the certificate in the data directory when identity.json
// changed, and when it is a new certificate, makes it the machine
// certificate; the next proof carries a new boot statement, signed with
// its key. It reports whether the credentials changed.
func (m *Machine) Refresh() (bool, error) {
	m.mu.Lock()
	c := m.cur
	m.lastRefresh = m.now()
	m.mu.Unlock()
	if c == nil || m.dir == "" {
		return false, nil
	}
	stamp, err := statIdentity(m.dir)
	if err != nil {
		return false, err
	}
	if stamp == c.stamp {
		return false, nil
	}
	id, leaf, chain, roots, err := identity.ReadIdentity(m.dir)
	if err != nil {
		return false, fmt.Errorf("read the renewed certificate: %w", err)
	}
	if leaf.Equal(c.leaf) {
		m.mu.Lock()
		c.stamp = stamp
		m.mu.Unlock()
		return false, nil
	}
	next, err := m.newCreds(id.NodeID, leaf, chain, roots, stamp)
	if err != nil {
		return false, err
	}
	if next.nodeID != m.nodeID {
		return false, fmt.Errorf("the renewed certificate is node %q, not %q: restart bcd node", next.nodeID, m.nodeID)
	}
	// The new statement is signed when a proof first needs it.
	m.mu.Lock()
	m.cur = next
	m.mu.Unlock()
	return true, nil
}

func statIdentity(dir string) (fileStamp, error) {
	fi, err := os.Stat(datadir.Layout(dir).Identity())
	if err != nil {
		return fileStamp{}, fmt.Errorf("look for a renewed certificate: %w", err)
	}
	st := fileStamp{mod: fi.ModTime(), size: fi.Size()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.inode = sys.Ino
	}
	return st, nil
}

// Close releases the node key the credentials hold.
func (m *Machine) Close() {
	m.mu.Lock()
	c := m.cur
	m.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.key != nil {
		identity.CloseSigner(c.key)
		c.key = nil
	}
}
