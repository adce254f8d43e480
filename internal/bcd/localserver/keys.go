package localserver

import (
	"crypto/ed25519"
	"sync"

	"github.com/nodetrust/nodetrust/callsig"
)

// keyStore holds the key of each local sender: the command line, the
// daemon itself and each running instance.
type keyStore struct {
	mu sync.RWMutex
	m  map[string]ed25519.PublicKey
}

var _ callsig.KeyStore = (*keyStore)(nil)

func newKeyStore() *keyStore { return &keyStore{m: map[string]ed25519.PublicKey{}} }

// Key returns the key of sender.
func (k *keyStore) Key(sender string) (ed25519.PublicKey, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	key, ok := k.m[sender]
	return key, ok
}

// add sets the key of sender unless sender has one; it reports whether it
// did.
func (k *keyStore) add(sender string, key ed25519.PublicKey) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, taken := k.m[sender]; taken {
		return false
	}
	k.m[sender] = key
	return true
}

// remove drops the key of sender if it is key.
func (k *keyStore) remove(sender string, key ed25519.PublicKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if cur, ok := k.m[sender]; ok && cur.Equal(key) {
		delete(k.m, sender)
	}
}
