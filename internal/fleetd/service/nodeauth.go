package service

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
)

// authedNode is a node authenticated by its certificate on this call.
type authedNode struct {
	// leaf is the certificate the node authenticated with; nil in the
	// owner that known returns for a certificate issued on the
	// connection, which is never parsed.
	leaf *x509.Certificate
	info pki.NodeCertInfo
	node store.Node
	cert store.Cert
	// issued is the last certificate this server issued to the caller on
	// this connection, and what it says; a renewal that presents it needs
	// no chain check.
	issued     *pki.IssuedLeaf
	issuedInfo pki.NodeCertInfo
}

// heldCert is what a renewal reads of the certificate it renews.
type heldCert struct {
	publicKey           crypto.PublicKey
	notBefore, notAfter time.Time
	// owner is the caller, as the certificate names it, when the
	// certificate is the one this connection proved in its handshake or
	// was issued on it: such a certificate needs neither a store look-up
	// nor the renewal proof. Nil for any other certificate.
	owner *authedNode
	// parsed is the certificate parsed; nil for one issued on the
	// connection, never nil when owner is nil.
	parsed *x509.Certificate
}

// known returns the caller's TLS certificate or the one issued to it on
// this connection, with its owner, when der is one of them.
func (a *authedNode) known(der []byte) (heldCert, bool) {
	if bytes.Equal(der, a.leaf.Raw) {
		held := heldOf(a.leaf)
		held.owner = a
		return held, true
	}
	if l := a.issued; l != nil && bytes.Equal(der, l.Raw) {
		return heldCert{
			publicKey: l.PublicKey, notBefore: l.NotBefore, notAfter: l.NotAfter,
			owner: &authedNode{info: a.issuedInfo, node: a.node},
		}, true
	}
	return heldCert{}, false
}

// heldOf is what a renewal reads of the parsed certificate c.
func heldOf(c *x509.Certificate) heldCert {
	return heldCert{publicKey: c.PublicKey, notBefore: c.NotBefore, notAfter: c.NotAfter, parsed: c}
}

// errUnauthenticated is what a node with a dead certificate is told.
func errUnauthenticated(why string) error {
	return refused(codes.Unauthenticated, "node certificate refused: %s", why)
}

// nodeFromPeer authenticates the caller by the node certificate of its
// TLS connection: it must chain to the node CA (checked in the handshake),
// be recorded, unrevoked, and of the node's current identity generation.
func (s *Server) nodeFromPeer(ctx context.Context) (*authedNode, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, errUnauthenticated("no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, errUnauthenticated("not TLS")
	}
	for _, chain := range ti.State.VerifiedChains {
		if len(chain) >= 2 && chain[1].Equal(s.cfg.Authority.NodeCA) {
			return s.checkNodeCert(ctx, chain[0])
		}
	}
	return nil, errUnauthenticated("no node certificate: this call needs the node's certificate (mutual TLS)")
}

// checkNodeCert checks a node certificate against the store.
func (s *Server) checkNodeCert(ctx context.Context, leaf *x509.Certificate) (*authedNode, error) {
	info, err := pki.ParseNodeCert(leaf)
	if err != nil {
		return nil, errUnauthenticated(err.Error())
	}
	if info.TrustDomain != s.cfg.Authority.TrustDomain {
		return nil, errUnauthenticated("trust domain " + info.TrustDomain)
	}
	serial := pki.SerialHex(leaf)
	cert, err := s.cfg.Store.GetCert(ctx, serial)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errUnauthenticated("unknown certificate " + serial)
	}
	if err != nil {
		return nil, storeFailure("get certificate", err)
	}
	if !cert.RevokedAt.IsZero() {
		return nil, errUnauthenticated(fmt.Sprintf("certificate %s was revoked (%s)", serial, cert.RevokedReason))
	}
	node, err := s.cfg.Store.GetNode(ctx, info.NodeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errUnauthenticated("node " + info.NodeID + " does not exist")
	}
	if err != nil {
		return nil, storeFailure("get node", err)
	}
	if cert.NodeID != node.ID || cert.Generation != node.Generation {
		return nil, errUnauthenticated(fmt.Sprintf("certificate of identity generation %d, the node is at %d", cert.Generation, node.Generation))
	}
	if !lifecycle.May(node.State, lifecycle.Session) {
		return nil, errUnauthenticated("node " + node.ID + " is " + node.State)
	}
	return &authedNode{leaf: leaf, info: info, node: node, cert: cert}, nil
}
