package localserver

import (
	"context"
	"sync"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/federation"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/localapi"
)

// relayPool keeps one federation client per address and node called.
type relayPool struct {
	mu    sync.Mutex
	conns map[[2]string]*localapi.Federation
}

func newRelayPool() *relayPool {
	return &relayPool{conns: map[[2]string]*localapi.Federation{}}
}

// get returns the client of node's daemon at addr, dialling it with m's
// TLS configuration for node.
func (p *relayPool) get(m *federation.Machine, addr, node string) (*localapi.Federation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := [2]string{addr, node}
	if c, ok := p.conns[k]; ok {
		return c, nil
	}
	c, err := localapi.DialFederation(addr, m.ClientTLS(node))
	if err != nil {
		return nil, err
	}
	p.conns[k] = c
	return c, nil
}

func (p *relayPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, c := range p.conns {
		c.Close()
		delete(p.conns, k)
	}
}

// address returns the federation address of node's daemon: the one the
// call gives, else the active launch's, else config.toml's.
func (s *Server) address(node, given string) string {
	if given != "" {
		return given
	}
	if l := s.launch.Load(); l != nil {
		if a := l.Address(node); a != "" {
			return a
		}
	}
	return s.c.Peers[node]
}

// relay sends a verified call of a local client to the daemon of another
// machine, with this machine's proof of the client, and returns that
// daemon's reply as it is.
func (s *Server) relay(ctx context.Context, env *callsig.Envelope, raw []byte, ke localapi.KeyExpr, given string) *localv1.CallReply {
	proofBytes, err := s.machine.ProofBytes(env.Sender)
	if err != nil {
		return failure("relay to node %q: %v", ke.Receiver, err)
	}
	addr := s.address(ke.Receiver, given)
	if addr == "" {
		return failure("relay to node %q: this daemon knows no address of it: place it under [machines] with an address in the launch file (bcd launch), add it to [federation.peers] in config.toml, or give the address with the call", ke.Receiver)
	}
	c, err := s.relays.get(s.machine, addr, ke.Receiver)
	if err != nil {
		return failure("relay to node %q at %s: %v", ke.Receiver, addr, err)
	}
	r, err := c.Send(ctx, &localv1.CallRequest{Envelope: raw, MachineProof: proofBytes})
	if err != nil {
		s.log.WarnContext(ctx, "relay failed", logkey.NodeID, ke.Receiver, "addr", addr, logkey.Error, err)
		return failure("relay to node %q at %s: %v", ke.Receiver, addr, err)
	}
	return r
}
