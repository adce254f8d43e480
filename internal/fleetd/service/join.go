package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/peer"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
)

// JoinRefused is the one message every refused join gets on the wire.
const JoinRefused = "Join refused"

// Limits on what an unauthenticated caller may send.
const (
	maxCSRBytes   = 4 << 10
	maxClaimBytes = 256
	maxClaimItems = 64
)

type joinService struct {
	joinv1.UnimplementedJoinServiceServer
	s *Server
}

// refusal is a join refusal: the reason stays on the server.
type refusal struct {
	// code classifies the reason for metrics and throttling.
	code   refusalCode
	reason string
	// audit is set when the caller proved something (a token opened), so
	// the refusal is worth an audit entry; refusals of unauthenticated
	// garbage are only logged and counted.
	audit   bool
	tokenID string
}

func (r *refusal) Error() string { return r.reason }

func refuse(code refusalCode, format string, args ...any) *refusal {
	return &refusal{code: code, reason: fmt.Sprintf(format, args...)}
}

func (j *joinService) Join(ctx context.Context, req *joinv1.JoinRequest) (*joinv1.JoinResponse, error) {
	reqID := newRequestID()
	resp, err := j.join(ctx, req)
	if err == nil {
		outcome := "signed"
		switch resp.Result.(type) {
		case *joinv1.JoinResponse_Challenge:
			outcome = "challenge"
		case *joinv1.JoinResponse_Pending:
			outcome = "pending"
		}
		j.s.metrics.join(req.Attestor, outcome)
		return resp, nil
	}
	var r *refusal
	if !errors.As(err, &r) {
		// An internal failure: the caller may retry.
		j.s.metrics.join(req.Attestor, "failed")
		if errors.Is(err, pki.ErrKeyUnavailable) {
			return nil, signFailure("join (request "+reqID+")", err, logkey.RequestID, reqID)
		}
		return nil, unavailable("join", "join could not be completed; retry later (request "+reqID+")", err, logkey.RequestID, reqID)
	}
	j.s.refusedJoin(ctx, req, r, reqID)
	return nil, r
}

func (j *joinService) join(ctx context.Context, req *joinv1.JoinRequest) (*joinv1.JoinResponse, error) {
	if err := checkJoinSize(req); err != nil {
		return nil, err
	}
	if len(req.Csr) == 0 || len(req.Csr) > maxCSRBytes {
		return nil, refuse(reasonCSR, "CSR missing or larger than %d bytes", maxCSRBytes)
	}
	csr, err := pki.ParseCSR(req.Csr)
	if err != nil {
		return nil, refuse(reasonCSR, "bad CSR: %v", err)
	}
	csrHash := sha256.Sum256(req.Csr)
	switch req.Attestor {
	case "token":
		return j.joinToken(ctx, req, csr, csrHash[:])
	case "tpm":
		return j.joinTPM(ctx, req, csr, csrHash[:])
	case "":
		return nil, refuse(reasonAttestor, "no attestor named")
	default:
		return nil, refuse(reasonAttestor, "attestor %q is not supported", capClaim(req.Attestor))
	}
}

// openedToken is a join token that opened for this request, and the
// refusal to use once its id is known (audited, since it proved a token).
type openedToken struct {
	tok  store.Token
	hash []byte
}

func (o *openedToken) deny(code refusalCode, format string, args ...any) error {
	r := refuse(code, format, args...)
	r.audit, r.tokenID = true, o.tok.ID
	return r
}

// openToken opens the sealed token of req for csrHash and checks it may
// join: unused, unexpired, for the role asked and the node id asked.
func (j *joinService) openToken(ctx context.Context, req *joinv1.JoinRequest, csrHash []byte) (*openedToken, error) {
	s := j.s
	secret, err := s.cfg.Authority.JoinEncryption.OpenToken(csrHash, req.SealedToken)
	if err != nil {
		return nil, refuse(reasonTokenSeal, "sealed token does not open for this CSR: %v", err)
	}
	hash := sha256.Sum256(secret)
	clear(secret)
	tok, err := s.cfg.Store.TokenByHash(ctx, hash[:])
	if errors.Is(err, store.ErrNotFound) {
		return nil, refuse(reasonTokenUnknown, "unknown token")
	}
	if err != nil {
		return nil, fmt.Errorf("look up token: %w", err)
	}
	o := &openedToken{tok: tok, hash: hash[:]}
	now := s.cfg.Now()
	switch {
	case !tok.UsedAt.IsZero():
		return nil, o.deny(reasonTokenUsed, "token already used by node %s at %s", tok.UsedBy, tok.UsedAt.UTC().Format(time.RFC3339))
	case !now.Before(tok.ExpiresAt):
		return nil, o.deny(reasonTokenExpired, "token expired at %s", tok.ExpiresAt.UTC().Format(time.RFC3339))
	case req.Role != "" && req.Role != tok.Role:
		return nil, o.deny(reasonTokenScope, "token is for role %q, the request asks for role %q", tok.Role, capClaim(req.Role))
	}
	if req.NodeId != "" {
		if err := pki.ValidNodeID(req.NodeId); err != nil {
			return nil, o.deny(reasonTokenScope, "requested node id: %v", err)
		}
		if tok.NodeID != "" && tok.NodeID != req.NodeId {
			return nil, o.deny(reasonTokenScope, "token is for node %q, the request asks for node %q", tok.NodeID, req.NodeId)
		}
	}
	return o, nil
}

func (j *joinService) joinToken(ctx context.Context, req *joinv1.JoinRequest, csr *x509.CertificateRequest, csrHash []byte) (*joinv1.JoinResponse, error) {
	s := j.s
	o, err := j.openToken(ctx, req, csrHash)
	if err != nil {
		return nil, err
	}
	tok := o.tok
	if req.DeferralId != "" && !tok.RequireApproval {
		return nil, o.deny(reasonDeferral, "a deferral id for a token that needs no approval")
	}
	now := s.cfg.Now()
	claims := claimsFrom(req.Claims)
	asked := req.NodeId
	var pending store.Pending
	if req.DeferralId != "" {
		if pending, err = j.pendingFor(ctx, req.DeferralId, o, csrHash); err != nil {
			return nil, err
		}
		asked = pending.NodeID
	}

	pl, err := j.place(ctx, lifecycle.Request{Attestor: "token", Token: &o.tok, Claims: claims, AskedNodeID: asked}, o)
	if err != nil {
		return nil, err
	}
	nodeID := pl.nodeID
	if len(pl.lakName) > 0 {
		// A token join has no AK: it would end the LAK's boot checks.
		return nil, o.deny(reasonLAK, "rule %s: node %s was installed with LAK %x; it re-joins only with --attestor tpm and that LAK (<data_dir>/devid), not with a token alone",
			RuleLAKSubstitute, nodeID, pl.lakName)
	}

	if tok.RequireApproval {
		if pending.ID == "" {
			pending = store.Pending{
				ID: randomHex(16), TokenHash: o.hash, TokenID: tok.ID, CSRHash: csrHash,
				NodeID: nodeID, Role: pl.role, Site: pl.site, Claims: claims,
				CreatedAt: now, ExpiresAt: tok.ExpiresAt,
			}
			if err := s.cfg.Store.CreatePending(ctx, pending); err != nil {
				return nil, fmt.Errorf("store pending join of node %s: %w", nodeID, err)
			}
			s.log.InfoContext(ctx, "join waiting for approval", logkey.NodeID, nodeID, logkey.TokenID, tok.ID, logkey.Peer, peerAddr(ctx))
		}
		if pending.NodeID != nodeID {
			return nil, o.deny(reasonDeferral, "the pending join was for node %s, it would now be node %s", pending.NodeID, nodeID)
		}
		if pending.ApprovedAt.IsZero() {
			return pendingResponse(s, pending), nil
		}
	}
	return j.issue(ctx, issuance{
		token: o, pendingID: pending.ID, placement: pl, attestor: "token", claims: claims,
		csr: csr, csrHash: csrHash, daemonVersion: req.DaemonVersion,
	})
}

// pendingResponse tells a join to wait for the owner's approval of p.
func pendingResponse(s *Server, p store.Pending) *joinv1.JoinResponse {
	return &joinv1.JoinResponse{Result: &joinv1.JoinResponse_Pending{Pending: &joinv1.JoinPending{
		DeferralId:   p.ID,
		RetryAfterMs: uint32(s.cfg.PendingPoll.Milliseconds()),
		Message:      fmt.Sprintf("node %s waits for approval: fleetd nodes approve %s", p.NodeID, p.NodeID),
	}}}
}

// placement is where a join lands: the node it makes or re-joins, on the
// lifecycle's terms.
type placement struct {
	nodeID     string
	reclaim    bool
	gen        uint64
	role, site string
	class      string
	// expectState and expectGen, when expectState is set, are the state
	// and generation the replaced node must still have when the join is
	// written.
	expectState string
	expectGen   uint64
	// from is the state the node leaves ("" for a new node); history are
	// the changes before the join's own.
	from    string
	history []store.StateChange
	why     string
	// claimKey names the claim the join settles.
	claimKey string
	// lakName is the LAK name of the node the join replaces (nil when it
	// has none): such a node re-joins only with that AK or a new LAK
	// certificate (joinLAK).
	lakName []byte
}

// place decides, with the lifecycle's admission rules, which node a join
// makes or re-joins. A refusal that leaves the machine waiting is recorded
// as a claim. o is the token that opened, or nil.
func (j *joinService) place(ctx context.Context, r lifecycle.Request, o *openedToken) (placement, error) {
	s := j.s
	deny := func(reason string) error {
		if o != nil {
			return o.deny(reasonNotAdmitted, "%s", reason)
		}
		return refuse(reasonNotAdmitted, "%s", reason)
	}
	out, err := s.admission.Decide(ctx, r)
	if err != nil {
		var rf *lifecycle.Refusal
		switch {
		case errors.As(err, &rf):
			if rf.Claim {
				j.recordClaim(ctx, r, rf.Reason, rf.Declared)
			}
			return placement{}, deny(rf.Reason)
		case errors.Is(err, lifecycle.ErrSourceUnavailable):
			return placement{}, deny(err.Error())
		}
		return placement{}, err
	}
	p := placement{from: out.From, history: out.History, why: out.Why, claimKey: lifecycle.ClaimKey(r.EKPin, r.Claims)}
	switch out.Kind {
	case lifecycle.Declared:
		d := out.Decl
		p.nodeID, p.role, p.site, p.class = d.Name, lifecycle.DeclaredRole(*d), d.Site, d.Class
		if p.site == "" && r.Token != nil {
			p.site = r.Token.Site
		}
		if n := out.Node; n != nil {
			p.reclaim, p.gen, p.expectState, p.expectGen = true, n.Generation+1, n.State, n.Generation
			p.lakName = n.LAKName
		} else if p.gen, err = s.cfg.Store.NextGeneration(ctx, d.Name); err != nil {
			return placement{}, fmt.Errorf("next generation of node %s: %w", d.Name, err)
		}
		return p, nil
	case lifecycle.Known:
		n := out.Node
		p.nodeID, p.reclaim, p.gen, p.role, p.site, p.class = n.ID, true, n.Generation+1, n.Role, n.Site, n.Class
		p.expectState, p.expectGen, p.lakName = n.State, n.Generation, n.LAKName
		if t := r.Token; t != nil {
			// A token piped with a known EK is spent, and its role and
			// site replace the node's.
			if r.Attestor == "tpm" && t.NodeID != "" && t.NodeID != n.ID {
				return placement{}, deny(fmt.Sprintf("token is for node %q, but EK %s belongs to node %q", t.NodeID, r.EKPin, n.ID))
			}
			p.role, p.site = t.Role, t.Site
		}
		return p, nil
	}
	if r.Token == nil {
		reason := fmt.Sprintf("EK %s belongs to no node, and the join carries no token", r.EKPin)
		j.recordClaim(ctx, r, reason, "")
		return placement{}, deny(reason)
	}
	id, reclaim, gen, old, err := j.chooseNode(ctx, *r.Token, r.AskedNodeID, r.Claims)
	if err != nil {
		var rf *refusal
		if errors.As(err, &rf) {
			return placement{}, deny(rf.reason)
		}
		return placement{}, err
	}
	p.nodeID, p.reclaim, p.gen, p.role, p.site, p.why = id, reclaim, gen, r.Token.Role, r.Token.Site, "join token "+r.Token.ID
	if old != nil {
		if rf := lifecycle.CheckRejoin(*old, r.Attestor, r.EKPin, r.Token.AllowReclaim); rf != nil {
			if rf.Claim {
				j.recordClaim(ctx, r, rf.Reason, "")
			}
			return placement{}, deny(rf.Reason)
		}
		p.class, p.from, p.expectState, p.expectGen = old.Class, old.State, old.State, old.Generation
		p.lakName = old.LAKName
	}
	return p, nil
}

// recordClaim keeps a machine that was not admitted as a claim (fleetd
// claims list): capped fields, first and last seen, count. Only requests
// that proved a token or a TPM get here, so hostile traffic writes none.
func (j *joinService) recordClaim(ctx context.Context, r lifecycle.Request, reason, declared string) {
	s := j.s
	key := lifecycle.ClaimKey(r.EKPin, r.Claims)
	if key == "" {
		return
	}
	c := store.Claim{Key: capClaim(key), Attestor: r.Attestor, EKPin: r.EKPin, ProductUUID: r.Claims.ProductUUID, Serials: r.Claims.Serials,
		MACs: r.Claims.MACs, Hostname: r.Claims.Hostname, Peer: capClaim(peerAddr(ctx)), Reason: capClaim(reason), Declared: declared, LastSeen: s.cfg.Now()}
	if err := s.cfg.Store.RecordClaim(ctx, c, s.cfg.MaxClaims); err != nil {
		s.log.ErrorContext(ctx, "record claim", logkey.Error, err)
		return
	}
	s.metrics.claim(r.Attestor)
}

// issuance is everything a successful join decided.
type issuance struct {
	token     *openedToken // nil for a tpm join without a token
	pendingID string
	placement
	attestor string
	claims   store.Claims
	ekPin    string
	akName   []byte
	// lakName is the node's LAK name, kept in its record (joinLAK).
	lakName []byte
	csr     *x509.CertificateRequest
	csrHash []byte

	daemonVersion string
	// boot, when not nil, is a tpm join's boot verdict: its evidence is
	// kept as the node's once the join is recorded.
	boot *judgedBoot
}

// issue signs the node certificate, records the join (spending the token
// and removing the pending join, if any) and signs the answer.
func (j *joinService) issue(ctx context.Context, in issuance) (*joinv1.JoinResponse, error) {
	s := j.s
	now := s.cfg.Now()
	lifetime := s.lifetimeFor(in.role)
	leaf, err := s.cfg.Authority.Issuer.IssueLeaf(pki.LeafRequest{
		PublicKey: in.csr.PublicKey,
		NodeID:    in.nodeID,
		Role:      in.role,
		Site:      in.site,
		TPMAKName: in.akName,
		NotBefore: now.Add(-backdate(lifetime)),
		NotAfter:  now.Add(lifetime),
	})
	if err != nil {
		return nil, fmt.Errorf("issue certificate for node %s: %w", in.nodeID, err)
	}
	// Sign the answer before the join is recorded: a signing key that
	// fails (a PKCS#11 token gone) then leaves the token unspent.
	signed, err := s.signResult(in.csrHash, leaf.Raw, in.nodeID, in.role, in.site, in.gen)
	if err != nil {
		return nil, err
	}
	serial := leaf.SerialHex()
	actor := "ek:" + in.ekPin
	var tokenHash []byte
	if in.token != nil {
		actor, tokenHash = "token:"+in.token.tok.ID, in.token.hash
	}
	var history []store.StateChange
	for _, h := range in.history {
		h.Time = now
		history = append(history, h)
	}
	if from := in.from; from != store.StateActive {
		if len(in.history) > 0 {
			from = in.history[len(in.history)-1].To
		}
		history = append(history, store.StateChange{Time: now, NodeID: in.nodeID, From: from, To: store.StateActive, Actor: actor,
			Reason: fmt.Sprintf("join by %s (%s)", in.attestor, in.why)})
	}
	err = s.cfg.Store.CompleteJoin(ctx, store.Join{
		TokenHash: tokenHash,
		PendingID: in.pendingID,
		Now:       now,
		Reclaim:   in.reclaim,
		Node: store.Node{
			ID: in.nodeID, SPIFFEID: pki.NodeSPIFFEID(s.cfg.Authority.TrustDomain, in.nodeID), Role: in.role, Site: in.site,
			State: store.StateActive, Generation: in.gen, Attestor: in.attestor,
			Claims: in.claims, DaemonVersion: capClaim(in.daemonVersion),
			JoinedAt: now, LastSeen: now, CertSerial: serial, CertNotAfter: leaf.NotAfter, EKPin: in.ekPin, Class: in.class,
			LAKName: in.lakName,
		},
		Cert: store.Cert{Serial: serial, NodeID: in.nodeID, Generation: in.gen, Kind: "join", IssuedAt: now, NotAfter: leaf.NotAfter},
		Audit: &store.AuditEvent{Time: now, Actor: actor, Action: "join", Subject: in.nodeID,
			Detail: fmt.Sprintf("attestor %s serial %s generation %d reclaim %t from %q: %s", in.attestor, serial, in.gen, in.reclaim, in.from, in.why)},
		ExpectState:      in.expectState,
		ExpectGeneration: in.expectGen,
		History:          history,
		ClaimKey:         in.claimKey,
	})
	if errors.Is(err, store.ErrConflict) {
		if in.token != nil {
			return nil, in.token.deny(reasonNodeConflict, "token or node id was taken by a concurrent join")
		}
		return nil, refuse(reasonNodeConflict, "node %s changed during the join", in.nodeID)
	}
	if err != nil {
		return nil, fmt.Errorf("record join of node %s: %w", in.nodeID, err)
	}
	if in.boot != nil {
		s.keepEvidence(ctx, in.nodeID, in.boot.verdict, in.boot.evidence)
	}
	s.log.InfoContext(ctx, "node joined", logkey.NodeID, in.nodeID, logkey.Attestor, in.attestor, "actor", actor,
		logkey.Serial, serial, "reclaim", in.reclaim, logkey.Generation, in.gen, logkey.Peer, peerAddr(ctx))
	if in.reclaim {
		// The reclaimed identity's certificates are revoked: its live
		// session here ends as a revocation's does (other replicas hear
		// it from the store's revocation feed).
		s.publishRevocation(ctx, in.nodeID, false)
		notice := &gatewayv1.RevocationNotice{Reason: "reclaimed", IdentityGeneration: in.gen}
		if s.sessions.notifyOlder(in.nodeID, in.gen, notice) {
			s.log.InfoContext(ctx, "session of the reclaimed identity ended", logkey.NodeID, in.nodeID, logkey.Generation, in.gen)
		}
	}
	return &joinv1.JoinResponse{Result: &joinv1.JoinResponse_Signed{Signed: signed}}, nil
}

// chooseNode decides which node a token join makes or reclaims, following
// the reclaim rules: a machine the control plane already knows (same
// product UUID or serial) needs a token that allows reclaim.
// It returns the node a reclaim replaces (nil for a new node); the
// lifecycle's state rules (lifecycle.CheckRejoin) are the caller's.
func (j *joinService) chooseNode(ctx context.Context, tok store.Token, asked string, claims store.Claims) (id string, reclaim bool, gen uint64, old *store.Node, err error) {
	st := j.s.cfg.Store
	var known []store.Node
	if claims.ProductUUID != "" || len(claims.Serials) > 0 {
		known, err = st.NodesByClaims(ctx, claims.ProductUUID, claims.Serials)
		if err != nil {
			return "", false, 0, nil, fmt.Errorf("look up nodes by claims: %w", err)
		}
	}
	want := tok.NodeID
	if want == "" {
		want = asked
	}
	if len(known) > 0 {
		old := known[0]
		if want != "" && want != old.ID {
			return "", false, 0, nil, refuse(reasonNodeConflict, "machine is known as node %s, the join asks for node %s", old.ID, want)
		}
		return old.ID, true, old.Generation + 1, &old, nil
	}
	if want != "" {
		old, err := st.GetNode(ctx, want)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return j.newNode(ctx, want)
		case err != nil:
			return "", false, 0, nil, fmt.Errorf("look up node %s: %w", want, err)
		case tok.AllowReclaim && tok.NodeID == want:
			return want, true, old.Generation + 1, &old, nil
		default:
			return "", false, 0, nil, refuse(reasonNodeConflict, "node id %s is taken by another machine", want)
		}
	}
	base := nodeIDFromHostname(claims.Hostname)
	if _, err := st.GetNode(ctx, base); errors.Is(err, store.ErrNotFound) {
		return j.newNode(ctx, base)
	} else if err != nil {
		return "", false, 0, nil, fmt.Errorf("look up node %s: %w", base, err)
	}
	return j.newNode(ctx, base+"-"+randomHex(3))
}

// newNode is chooseNode's answer for a new node id: its generation starts
// above any the id had before, a deleted node's included, so that the old
// certificates stay dead.
func (j *joinService) newNode(ctx context.Context, id string) (string, bool, uint64, *store.Node, error) {
	gen, err := j.s.cfg.Store.NextGeneration(ctx, id)
	if err != nil {
		return "", false, 0, nil, fmt.Errorf("next generation of node %s: %w", id, err)
	}
	return id, false, gen, nil, nil
}

// signResult signs the answer to a join or renewal that issued the leaf
// leafDER: the chain, the roots and what the certificate says, for the
// node to check against the JoinService key it pinned.
func (s *Server) signResult(csrHash, leafDER []byte, nodeID, role, site string, gen uint64) (*joinv1.SignedJoinResult, error) {
	a := s.cfg.Authority
	chain := make([][]byte, 0, 1+len(a.Issuer.Chain()))
	chain = append(chain, leafDER)
	for _, c := range a.Issuer.Chain() {
		chain = append(chain, c.Raw)
	}
	res := &joinv1.JoinResult{
		CsrSha256:          csrHash,
		Chain:              chain,
		Roots:              [][]byte{a.Root.Raw},
		NodeId:             nodeID,
		SpiffeId:           pki.NodeSPIFFEID(a.TrustDomain, nodeID),
		TrustDomain:        a.TrustDomain,
		Role:               role,
		Site:               site,
		IdentityGeneration: gen,
		ServerTimeUnixNano: s.cfg.Now().UnixNano(),
	}
	signed, err := joinresponse.Sign(a.JoinSigner, res)
	if err != nil {
		return nil, fmt.Errorf("sign join result for node %s: %w", nodeID, err)
	}
	return signed, nil
}

// nodeIDFromHostname makes a valid node id from a claimed hostname.
func nodeIDFromHostname(h string) string {
	h = strings.ToLower(h)
	if i := strings.IndexByte(h, '.'); i > 0 {
		h = h[:i]
	}
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
		if b.Len() >= 40 {
			break
		}
	}
	id := strings.Trim(b.String(), "-")
	if id == "" {
		id = "node"
	}
	return id
}

func claimsFrom(c *joinv1.HardwareClaims) store.Claims {
	if c == nil {
		return store.Claims{}
	}
	var serials []string
	for _, s := range []string{c.ProductSerial, c.BoardSerial, c.ChassisSerial} {
		if s != "" {
			serials = append(serials, capClaim(s))
		}
	}
	return store.Claims{
		ProductUUID: strings.ToLower(capClaim(c.ProductUuid)),
		Serials:     serials,
		MACs:        capList(c.Macs),
		GPUUUIDs:    capList(c.GpuUuids),
		Hostname:    capClaim(c.Hostname),
		BootID:      capClaim(c.BootId),
	}
}

// capClaim bounds an untrusted string before it is stored or logged.
func capClaim(s string) string {
	if len(s) > maxClaimBytes {
		s = s[:maxClaimBytes]
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	return s
}

func capList(in []string) []string {
	if len(in) > maxClaimItems {
		in = in[:maxClaimItems]
	}
	out := make([]string, 0, len(in))
	for _, s := range in {
		out = append(out, capClaim(s))
	}
	return out
}

func newRequestID() string { return randomHex(8) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
