package localserver

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// maxPeers bounds the machines the daemon remembers calls of; only calls
// with a verified machine proof of this daemon's CA are remembered.
const maxPeers = 4096

type peer struct {
	node, bootID string
	last         time.Time
}

// peerBook remembers the machines whose calls the daemon took, for
// membership.
type peerBook struct {
	mu sync.Mutex
	m  map[string]*peer
}

func newPeerBook() *peerBook { return &peerBook{m: map[string]*peer{}} }

// called records a call of node in boot bootID at time at.
func (b *peerBook) called(node, bootID string, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, ok := b.m[node]
	if !ok {
		if len(b.m) >= maxPeers {
			b.evictOldest()
		}
		p = &peer{node: node}
		b.m[node] = p
	}
	p.bootID, p.last = bootID, at
}

func (b *peerBook) evictOldest() {
	var oldest *peer
	for _, p := range b.m {
		if oldest == nil || p.last.Before(oldest.last) {
			oldest = p
		}
	}
	if oldest != nil {
		delete(b.m, oldest.node)
	}
}

func (b *peerBook) list() []peer {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]peer, 0, len(b.m))
	for _, p := range b.m {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(x, y peer) int { return strings.Compare(x.node, y.node) })
	return out
}
