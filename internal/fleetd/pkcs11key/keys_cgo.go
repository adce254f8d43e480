//go:build cgo

package pkcs11key

import (
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/miekg/pkcs11"

	"github.com/nodetrust/nodetrust/pki"
)

// Keys opens and makes keys in PKCS#11 tokens. One Keys serves a process:
// it keeps one connection per token, shared by the token's keys, and
// reconnects to every token of a module together (a module such as
// SoftHSM2 sees a token again only after it is finalized and initialized
// anew). It is safe for concurrent use.
type Keys struct {
	cfg     Config
	mu      sync.Mutex
	modules map[string]*module
}

// New returns a Keys with cfg's defaults filled in.
func New(cfg Config) *Keys {
	cfg.defaults()
	return &Keys{cfg: cfg, modules: map[string]*module{}}
}

// module is one PKCS#11 library and the tokens opened through it.
type module struct {
	k    *Keys
	path string
	// mu is held for reading while a key signs and for writing while the
	// module's tokens reconnect.
	mu     sync.RWMutex
	tokens map[string]*token // by TokenString
	keys   []*key
	// gen counts connections, so that a failure seen on an old one does
	// not break a new one.
	gen uint64
	// down is why the module's tokens are unavailable; nil when they
	// answer. lastTry is the last reconnect attempt.
	down    error
	lastTry time.Time
	// fatal stops reconnecting: the PIN was refused.
	fatal error
}

// token is one token's connection.
type token struct {
	uri     *URI
	pinFile string
	pin     string
	ctx     *crypto11.Context
}

// key is one key in a token; it implements crypto.Signer.
type key struct {
	m      *module
	tok    *token
	label  string
	id     []byte
	pub    crypto.PublicKey
	signer crypto11.Signer
}

// Close closes every token connection. Signers from this Keys fail after.
func (k *Keys) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, m := range k.modules {
		m.mu.Lock()
		m.closeTokens()
		m.fatal = errors.New("closed")
		m.mu.Unlock()
	}
	k.modules = map[string]*module{}
	return nil
}

// Open opens the key ref names, for use; it is a [pki.KeyOpener]. The
// key's token connection is made (and the PIN checked) now.
func (k *Keys) Open(use pki.KeyUse, ref string) (crypto.Signer, error) {
	u, err := ParseURI(ref)
	if err != nil {
		return nil, err
	}
	if u.Object == "" && len(u.ID) == 0 {
		return nil, fmt.Errorf("%s names no key: add object= (its label) or id=", ref)
	}
	m, tok, err := k.token(u)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := findKey(tok, u.Object, u.ID)
	if err != nil {
		return nil, err
	}
	kk := &key{m: m, tok: tok, label: u.Object, id: u.ID, pub: s.Public(), signer: s}
	m.keys = append(m.keys, kk)
	return kk, nil
}

// Generate makes a new P-256 key labelled label inside the token u names,
// not extractable, with u's id as its CKA_ID or else a random one (a
// YubiKey's PIV module picks the slot by id: 1 is 9a, 2 is 9c, …); it
// refuses when the token already holds a key with that label or id. The
// reference it returns is u with the key's label (as the token stored it:
// some tokens name keys themselves) and id.
func (k *Keys) Generate(u *URI, label string) (*pki.ExternalKey, error) {
	if label == "" {
		return nil, errors.New("generate a key: empty label")
	}
	_, tok, err := k.token(u)
	if err != nil {
		return nil, err
	}
	if found, err := tok.ctx.FindKeyPairs(nil, []byte(label)); err != nil {
		return nil, fmt.Errorf("look for a key labelled %q in %s: %w", label, u.TokenString(), err)
	} else if len(found) > 0 {
		return nil, fmt.Errorf("%s already holds a key labelled %q: choose another object= for --pkcs11, or delete that key", u.TokenString(), label)
	}
	id := u.ID
	if len(id) == 0 {
		id = make([]byte, 8)
		if _, err := rand.Read(id); err != nil {
			return nil, fmt.Errorf("generate a key id: %w", err)
		}
	} else if found, err := tok.ctx.FindKeyPairs(id, nil); err != nil {
		return nil, fmt.Errorf("look for a key with id %x in %s: %w", id, u.TokenString(), err)
	} else if len(found) > 0 {
		return nil, fmt.Errorf("%s already holds a key with id %x: choose another id=, or delete that key", u.TokenString(), id)
	}
	s, err := tok.ctx.GenerateECDSAKeyPairWithLabel(id, []byte(label), elliptic.P256())
	if err != nil {
		return nil, fmt.Errorf("generate a P-256 key in %s: %w", u.TokenString(), err)
	}
	if a, err := tok.ctx.GetAttribute(s, crypto11.CkaLabel); err == nil && a != nil && len(a.Value) > 0 {
		label = string(a.Value)
	}
	ref := *u
	ref.Object, ref.ID = label, id
	return &pki.ExternalKey{Signer: s, Ref: ref.String(), Discard: s.Delete}, nil
}

// token returns the connection to u's token, opening it (and its module)
// the first time.
func (k *Keys) token(u *URI) (*module, *token, error) {
	path, pinFile, err := k.cfg.where(u)
	if err != nil {
		return nil, nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	m := k.modules[path]
	if m == nil {
		m = &module{k: k, path: path, tokens: map[string]*token{}}
		k.modules[path] = m
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	name := u.TokenString()
	if t := m.tokens[name]; t != nil {
		if t.pinFile != pinFile {
			return nil, nil, fmt.Errorf("%s: one key names PIN file %s, another %s; a token has one PIN", name, t.pinFile, pinFile)
		}
		return m, t, nil
	}
	pin, err := ReadPIN(pinFile)
	if err != nil {
		return nil, nil, err
	}
	t := &token{uri: u, pinFile: pinFile, pin: pin}
	if err := m.connect(t); err != nil {
		return nil, nil, err
	}
	m.tokens[name] = t
	return m, t, nil
}

// connect opens t's connection and logs in.
func (m *module) connect(t *token) error {
	cfg := &crypto11.Config{Path: m.path, Pin: t.pin, TokenLabel: t.uri.Token, TokenSerial: t.uri.Serial, SlotNumber: t.uri.SlotID}
	ctx, err := crypto11.Configure(cfg)
	if err != nil {
		if isPINError(err) {
			return fmt.Errorf("log in to %s (module %s) with the PIN in %s: %w (%v); %s", t.uri.TokenString(), m.path, t.pinFile, ErrPIN, err, pinHelp(t.pinFile))
		}
		return fmt.Errorf("open %s (module %s): %w: %w; check that the token is present and the module path is right", t.uri.TokenString(), m.path, pki.ErrKeyUnavailable, err)
	}
	t.ctx = ctx
	return nil
}

// isPINError reports whether a token refused the PIN.
func isPINError(err error) bool {
	var p pkcs11.Error
	if !errors.As(err, &p) {
		return false
	}
	switch p {
	case pkcs11.CKR_PIN_INCORRECT, pkcs11.CKR_PIN_INVALID, pkcs11.CKR_PIN_LEN_RANGE,
		pkcs11.CKR_PIN_EXPIRED, pkcs11.CKR_PIN_LOCKED:
		return true
	}
	return false
}

// findKey finds the one key pair with label and id in t.
func findKey(t *token, label string, id []byte) (crypto11.Signer, error) {
	var l []byte
	if label != "" {
		l = []byte(label)
	}
	found, err := t.ctx.FindKeyPairs(id, l)
	if err != nil {
		return nil, fmt.Errorf("find key %q in %s: %w: %w", label, t.uri.TokenString(), pki.ErrKeyUnavailable, err)
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("%s holds no key pair labelled %q with id %x: %w; was it made with fleetd init --pkcs11 in this token?", t.uri.TokenString(), label, id, pki.ErrNoKey)
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("%s holds %d key pairs labelled %q with id %x: name the key by its id= too", t.uri.TokenString(), len(found), label, id)
}

// closeTokens closes every connection of m, so that the module is
// finalized once no connection is left.
func (m *module) closeTokens() {
	for _, t := range m.tokens {
		if t.ctx != nil {
			_ = t.ctx.Close()
			t.ctx = nil
		}
	}
}

// Public returns the key's public key, read when it was opened.
func (kk *key) Public() crypto.PublicKey { return kk.pub }

// Sign signs digest in the token. When the token does not answer, the
// error wraps [pki.ErrKeyUnavailable], and the module's tokens are
// reconnected on a later call, at most once per RetryInterval; signing
// fails at once in between.
func (kk *key) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	m := kk.m
	for range 2 {
		m.mu.RLock()
		if m.down == nil && m.fatal == nil {
			gen, s := m.gen, kk.signer
			sig, err := s.Sign(rand.Reader, digest, opts)
			m.mu.RUnlock()
			if err == nil {
				return sig, nil
			}
			return nil, m.failed(gen, kk, err)
		}
		m.mu.RUnlock()
		if err := m.reconnect(); err != nil {
			if !errors.Is(err, pki.ErrKeyUnavailable) {
				err = fmt.Errorf("%w: %w", pki.ErrKeyUnavailable, err)
			}
			return nil, fmt.Errorf("sign with key %q of %s: %w", kk.label, kk.tok.uri.TokenString(), err)
		}
	}
	return nil, fmt.Errorf("sign with key %q of %s: %w: the token went away again", kk.label, kk.tok.uri.TokenString(), pki.ErrKeyUnavailable)
}

// failed records that signing failed on connection gen, marks the module
// down unless a newer connection exists, and returns the caller's error.
func (m *module) failed(gen uint64, kk *key, err error) error {
	e := fmt.Errorf("sign with key %q of %s: %w: %w", kk.label, kk.tok.uri.TokenString(), pki.ErrKeyUnavailable, err)
	m.mu.Lock()
	first := m.gen == gen && m.down == nil
	if first {
		m.down = e
		m.lastTry = m.k.cfg.Now()
	}
	m.mu.Unlock()
	if first {
		m.notify(false, e)
	}
	return e
}

// reconnect closes and reopens every token of the module and finds each
// key again, at most once per RetryInterval. It returns why the module is
// still unavailable, or nil.
func (m *module) reconnect() error {
	m.mu.Lock()
	if m.fatal != nil {
		defer m.mu.Unlock()
		return m.fatal
	}
	if m.down == nil {
		m.mu.Unlock()
		return nil
	}
	now := m.k.cfg.Now()
	if now.Sub(m.lastTry) < m.k.cfg.RetryInterval {
		defer m.mu.Unlock()
		return m.down
	}
	m.lastTry = now
	err := m.reopen()
	recovered := err == nil
	if recovered {
		m.down = nil
		m.gen++
	} else {
		if errors.Is(err, ErrPIN) {
			m.fatal = err
		}
		m.down = err
	}
	m.mu.Unlock()
	if recovered {
		m.notify(true, nil)
	}
	return err
}

// reopen is reconnect's work, with m.mu held.
func (m *module) reopen() error {
	m.closeTokens()
	for _, t := range m.tokens {
		if err := m.connect(t); err != nil {
			m.closeTokens()
			return err
		}
	}
	for _, kk := range m.keys {
		s, err := findKey(kk.tok, kk.label, kk.id)
		if err != nil {
			m.closeTokens()
			return fmt.Errorf("%w (%w)", err, pki.ErrKeyUnavailable)
		}
		if !publicKeysEqual(s.Public(), kk.pub) {
			m.closeTokens()
			return fmt.Errorf("%s returned, but its key %q is not the one fleetd started with: %w; restore the right token or restart fleetd", kk.tok.uri.TokenString(), kk.label, pki.ErrKeyUnavailable)
		}
		kk.signer = s
	}
	return nil
}

// notify tells OnChange, once per token.
func (m *module) notify(available bool, err error) {
	if m.k.cfg.OnChange == nil {
		return
	}
	m.mu.RLock()
	names := make([]string, 0, len(m.tokens))
	for n := range m.tokens {
		names = append(names, n)
	}
	m.mu.RUnlock()
	for _, n := range names {
		m.k.cfg.OnChange(Event{Token: n, Module: m.path, Available: available, Err: err})
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}
