package service

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
)

// maxClockSkew bounds how far a renewal's client time may be from ours.
const maxClockSkew = 5 * time.Minute

// Renew is the unary form of a renewal, for a node without a live session.
func (j *joinService) Renew(ctx context.Context, req *joinv1.RenewRequest) (*joinv1.RenewResponse, error) {
	caller, err := j.s.nodeFromPeer(ctx)
	if err != nil {
		return nil, err
	}
	signed, err := j.s.renew(ctx, caller, req, nil)
	if err != nil {
		return nil, err
	}
	return &joinv1.RenewResponse{Signed: signed}, nil
}

// renew checks a renewal from an authenticated caller and issues the next
// certificate (seed 000, "Renewal"; DESIGN.md section 3), and counts the
// outcome.
func (s *Server) renew(ctx context.Context, caller *authedNode, req *joinv1.RenewRequest, att *attestedRenewal) (*joinv1.SignedJoinResult, error) {
	signed, err := s.renewOnce(ctx, caller, req, att)
	s.metrics.renewal(codeOf(err))
	return signed, err
}

// att is the boot evidence the renewal carries (nil for a plain renewal):
// with boot policy, a certificate that names an AK renews only with a
// quote by that AK over a nonce of this session that the policy of the
// node's class accepts at renewal.
func (s *Server) renewOnce(ctx context.Context, caller *authedNode, req *joinv1.RenewRequest, att *attestedRenewal) (*joinv1.SignedJoinResult, error) {
	now := s.cfg.Now()
	if len(req.Chain) == 0 || len(req.Chain) > 8 {
		return nil, refused(codes.InvalidArgument, "renewal needs the current chain, leaf first")
	}
	held, err := s.currentLeaf(caller, req.Chain, now)
	if err != nil {
		return nil, err
	}
	// A certificate this connection proved, or was issued, needs no store
	// lookup: RecordRenewal refuses the renewal if the node's generation
	// moved since (revoked, reclaimed or deleted; a deletion leaves a
	// tombstone, so a re-created node never has this generation).
	cur := held.owner
	// Nor does it need the renewal proof: the connection's handshake
	// proved the key of its certificate, and one issued on the connection
	// was issued to its holder (docs/performance.md, "The renewal proof
	// and the signed response"). Any other certificate is proved by it.
	needProof := cur == nil
	if cur == nil {
		if cur, err = s.checkNodeCert(ctx, held.parsed); err != nil {
			return nil, err
		}
	}
	if cur.node.ID != caller.node.ID {
		return nil, refused(codes.PermissionDenied, "the certificate renewed is node %s's, the caller is node %s", cur.node.ID, caller.node.ID)
	}
	if !lifecycle.May(cur.node.State, lifecycle.Renew) {
		return nil, notRenewing(cur.node)
	}
	if skew := now.Sub(time.Unix(0, req.ClientTimeUnixNano)); skew > maxClockSkew || skew < -maxClockSkew {
		return nil, refused(codes.InvalidArgument, "client time is %s from the control plane's; synchronise the clock", skew.Round(time.Second))
	}
	if len(req.Csr) > maxCSRBytes {
		return nil, refused(codes.InvalidArgument, "CSR larger than %d bytes", maxCSRBytes)
	}
	csr, err := pki.ParseCSR(req.Csr)
	if err != nil {
		return nil, refused(codes.InvalidArgument, "bad CSR: %v", err)
	}
	csrHash := sha256.Sum256(req.Csr)
	if needProof {
		if err := pki.VerifyRenewProof(held.publicKey, csrHash[:], req.ClientTimeUnixNano, req.Proof); err != nil {
			// The caller proved a certificate of the same node in the
			// handshake, yet the proof of this one is by another key:
			// two keys for one certificate.
			s.revokeCloned(ctx, cur.node.ID, "renewal proof by a key other than the certified one")
			return nil, refused(codes.Unauthenticated, "renewal proof does not verify with the certified key; the certificate was revoked")
		}
	}
	if samePublicKey(held.publicKey, csr.PublicKey) {
		return nil, refused(codes.InvalidArgument, "the renewal must certify a new key")
	}

	if len(cur.info.TPMAKName) > 0 {
		// No downgrade: the next key must be certified by the AK the
		// current certificate names.
		if err := checkKeyAttestation(req.KeyAttestation, cur.info.TPMAKName, csrHash[:], csr.PublicKey); err != nil {
			return nil, err
		}
		if s.cfg.BootPolicy != nil {
			if err := s.renewalBoot(ctx, cur, req.KeyAttestation.AkPublic, att); err != nil {
				return nil, err
			}
		}
	}

	// The count that decides is RecordRenewalLimited's, in the
	// transaction that records the renewal, so that renewals racing on
	// several replicas cannot all pass. A node this replica saw refused is
	// refused again from memory until its retry time, before any signing.
	limit := store.RenewalLimit{Max: s.cfg.RenewalLimit, Window: s.cfg.RenewalWindow}
	if over := s.overLimit.refused(cur.node.ID, cur.node.Generation, now); over != nil {
		return nil, overLimit(over, now)
	}

	lifetime := s.lifetimeFor(cur.node.Role)
	next, err := s.cfg.Authority.Issuer.IssueLeaf(pki.LeafRequest{
		PublicKey: csr.PublicKey,
		NodeID:    cur.node.ID,
		Role:      cur.info.Role,
		Site:      cur.info.Site,
		TPMAKName: cur.info.TPMAKName,
		NotBefore: now.Add(-backdate(lifetime)),
		NotAfter:  now.Add(lifetime),
	})
	if err != nil {
		return nil, signFailure("renewal", fmt.Errorf("issue: %w", err), logkey.NodeID, cur.node.ID)
	}
	// Sign the answer before the renewal is recorded, so that a signing
	// key that fails does not count against the node's renewal limit.
	signed, err := s.signResult(csrHash[:], next.Raw, cur.node.ID, cur.info.Role, cur.info.Site, cur.node.Generation)
	if err != nil {
		return nil, signFailure("renewal", fmt.Errorf("sign: %w", err), logkey.NodeID, cur.node.ID)
	}
	serial := next.SerialHex()
	err = s.cfg.Store.RecordRenewalLimited(ctx, store.Cert{Serial: serial, NodeID: cur.node.ID, Generation: cur.node.Generation, Kind: "renew", IssuedAt: now, NotAfter: next.NotAfter}, limit, nil)
	var over *store.RenewalLimitError
	if errors.As(err, &over) {
		// The node is at its limit (renewals on this replica or another).
		s.overLimit.remember(cur.node.Generation, over, now)
		return nil, overLimit(over, now)
	}
	if errors.Is(err, store.ErrConflict) {
		// The node changed since this session read it: quarantined (the
		// certificate stays good, the renewal waits for a release) or
		// revoked, retired or re-joined (the certificate is dead).
		if n, gerr := s.cfg.Store.GetNode(ctx, cur.node.ID); gerr == nil && n.Generation == cur.node.Generation && n.State == store.StateQuarantined {
			return nil, notRenewing(n)
		}
		return nil, refused(codes.Unauthenticated, "node %s was revoked during the renewal", cur.node.ID)
	}
	if err != nil {
		return nil, unavailable("renewal", "renewal could not be recorded; retry", fmt.Errorf("record: %w", err), logkey.NodeID, cur.node.ID)
	}
	caller.issued, caller.issuedInfo = next, pki.NodeCertInfo{
		NodeID: cur.node.ID, TrustDomain: cur.info.TrustDomain, SPIFFEID: cur.info.SPIFFEID,
		Role: cur.info.Role, Site: cur.info.Site, TPMAKName: cur.info.TPMAKName,
	}
	s.log.InfoContext(ctx, "node renewed", logkey.NodeID, cur.node.ID, logkey.Serial, serial, "not_after", next.NotAfter.UTC().Format(time.RFC3339))
	return signed, nil
}

// overLimit is the refusal of a renewal at now over the node's renewal
// limit, with the pushback until the next one may pass.
func overLimit(over *store.RenewalLimitError, now time.Time) error {
	wait := max(over.RetryAt.Sub(now), time.Millisecond)
	e := refused(codes.ResourceExhausted, "node %s renewed %d times in %s; retry in %s", over.NodeID, over.Count, over.Limit.Window, wait.Round(time.Millisecond))
	e.pushback = wait
	return e
}

// currentLeaf returns the renewal's current certificate once it is known
// to be one the node CA issued and valid now. A certificate this caller
// already proved (its TLS certificate, or one this server issued to it on
// the same session) is only checked for its validity period: its chain was
// verified then, and re-verifying costs as much as signing a new leaf.
// Any other is parsed and verified, and returned with parsed set.
func (s *Server) currentLeaf(caller *authedNode, chain [][]byte, now time.Time) (heldCert, error) {
	leaf, known := caller.known(chain[0])
	if !known {
		c, err := x509.ParseCertificate(chain[0])
		if err != nil {
			return heldCert{}, refused(codes.InvalidArgument, "parse the current certificate: %v", err)
		}
		inter := x509.NewCertPool()
		for _, der := range chain[1:] {
			ic, err := x509.ParseCertificate(der)
			if err != nil {
				return heldCert{}, refused(codes.InvalidArgument, "parse the chain: %v", err)
			}
			inter.AddCert(ic)
		}
		roots := x509.NewCertPool()
		roots.AddCert(s.cfg.Authority.Root)
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return heldCert{}, refused(codes.Unauthenticated, "the current certificate does not verify (expired certificates cannot renew: join again): %v", err)
		}
		leaf = heldOf(c)
	}
	if now.Before(leaf.notBefore) || now.After(leaf.notAfter) {
		return heldCert{}, refused(codes.Unauthenticated, "the current certificate is not valid now (expired certificates cannot renew: join again)")
	}
	return leaf, nil
}

// notRenewing is the refusal of a renewal by a node whose state does not
// renew (docs/lifecycle.md): a quarantined node keeps its certificate and
// tries again later.
func notRenewing(n store.Node) error {
	if n.State == store.StateQuarantined {
		return refused(codes.FailedPrecondition, "node %s is quarantined: renewal refused until fleetd nodes release %s", n.ID, n.ID)
	}
	return refused(codes.Unauthenticated, "node %s is %s and does not renew", n.ID, n.State)
}

// lifetimeFor caps ramdisk nodes' certificates at two hours.
func (s *Server) lifetimeFor(role string) time.Duration {
	if slices.Contains(s.cfg.RamdiskRoles, role) {
		return min(s.cfg.NodeCertLifetime, RamdiskMaxLifetime)
	}
	return s.cfg.NodeCertLifetime
}

// RamdiskMaxLifetime is the longest a ramdisk node's certificate lives.
const RamdiskMaxLifetime = 2 * time.Hour

// backdate is how far before issuance a certificate starts, for clocks a
// little behind: a minute, or a quarter of a short lifetime.
func backdate(lifetime time.Duration) time.Duration {
	return min(time.Minute, lifetime/4)
}

// checkKeyAttestation checks that the AK named akName certified the key
// of the renewal's CSR.
func checkKeyAttestation(ka *joinv1.KeyAttestation, akName, csrHash []byte, csrKey crypto.PublicKey) error {
	if ka == nil {
		return refused(codes.PermissionDenied, "the certificate names a TPM AK: the renewal needs that AK's certification of the new key")
	}
	name, err := attest.AKName(ka.AkPublic)
	if err != nil {
		return refused(codes.InvalidArgument, "AK public area: %v", err)
	}
	if !bytes.Equal(name, akName) {
		return refused(codes.PermissionDenied, "the new key is certified by AK %x, the certificate names AK %x", name, akName)
	}
	keyPub, err := attest.VerifyCertify(ka.AkPublic, ka.CertifyAttest, ka.CertifySignature, ka.KeyPublic, csrHash)
	if err != nil {
		return refused(codes.PermissionDenied, "the AK's certification of the new key: %v", err)
	}
	if !samePublicKey(keyPub, csrKey) {
		return refused(codes.PermissionDenied, "the AK certified another key than the CSR's")
	}
	return nil
}
