package service

import (
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// maxOverLimit bounds how many refused nodes overLimitMemo remembers.
const maxOverLimit = 4096

// overLimitMemo remembers the nodes whose last renewal the store refused
// as over the renewal limit, until the refusal's RetryAt, so that a node
// that keeps asking is refused again before anything is signed. The store
// (RecordRenewalLimited) stays the authority: a node absent here is
// counted there, in the transaction that records its renewal. Forgetting
// an entry (the memo is full) only costs a signature.
type overLimitMemo struct {
	mu    sync.Mutex
	nodes map[overLimitKey]*store.RenewalLimitError
}

// overLimitKey is a node's identity generation: a re-joined node is
// another generation and counts afresh.
type overLimitKey struct {
	nodeID string
	gen    uint64
}

// refused returns the store's refusal of the node's last renewal if it
// still holds at now.
func (m *overLimitMemo) refused(nodeID string, gen uint64, now time.Time) *store.RenewalLimitError {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := overLimitKey{nodeID, gen}
	e := m.nodes[k]
	if e != nil && !now.Before(e.RetryAt) {
		delete(m.nodes, k)
		return nil
	}
	return e
}

// remember keeps the store's refusal e of a renewal of the node, dropping
// the refusals that no longer hold at now when the memo is full (and
// every one if none has lapsed).
func (m *overLimitMemo) remember(gen uint64, e *store.RenewalLimitError, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.nodes == nil {
		m.nodes = map[overLimitKey]*store.RenewalLimitError{}
	}
	if len(m.nodes) >= maxOverLimit {
		for k, old := range m.nodes {
			if !now.Before(old.RetryAt) {
				delete(m.nodes, k)
			}
		}
		if len(m.nodes) >= maxOverLimit {
			clear(m.nodes)
		}
	}
	m.nodes[overLimitKey{e.NodeID, gen}] = e
}
