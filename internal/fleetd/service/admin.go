package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
)

// TokenPrefix starts every join token, so a leaked token is recognisable
// by secret scanners.
const TokenPrefix = "ntjt_"

type adminService struct {
	adminv1.UnimplementedAdminServer
	s *Server
}

type adminKey struct{}

// authorizeAdmin lets Admin calls through only with an admin client
// certificate issued by the serving CA; other services pass untouched.
func (s *Server) authorizeAdmin(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !strings.HasPrefix(info.FullMethod, "/"+adminv1.Admin_ServiceDesc.ServiceName+"/") {
		return h(ctx, req)
	}
	name, ok := s.adminFromPeer(ctx)
	if !ok {
		return nil, refused(codes.Unauthenticated, "admin calls need the admin client certificate from 'fleetd init' (admin/owner.crt)")
	}
	return h(context.WithValue(ctx, adminKey{}, name), req)
}

func (s *Server) adminFromPeer(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", false
	}
	for _, chain := range ti.State.VerifiedChains {
		if len(chain) < 2 || !chain[1].Equal(s.cfg.Authority.ServingCA) {
			continue
		}
		if name, ok := pki.AdminIdentity(chain[0], s.cfg.Authority.TrustDomain); ok {
			return name, true
		}
	}
	return "", false
}

func adminName(ctx context.Context) string {
	n, _ := ctx.Value(adminKey{}).(string)
	return n
}

func (a *adminService) CreateToken(ctx context.Context, req *adminv1.CreateTokenRequest) (*adminv1.CreateTokenResponse, error) {
	s := a.s
	if req.Role == "" {
		return nil, refused(codes.InvalidArgument, "a token needs a role (--role)")
	}
	if err := pki.ValidNodeID(req.Role); err != nil {
		return nil, refused(codes.InvalidArgument, "role %q: %v", req.Role, err)
	}
	if req.Site != "" {
		if err := pki.ValidNodeID(req.Site); err != nil {
			return nil, refused(codes.InvalidArgument, "site %q: %v", req.Site, err)
		}
	}
	if req.NodeId != "" {
		if err := pki.ValidNodeID(req.NodeId); err != nil {
			return nil, refused(codes.InvalidArgument, "node id %q: %v", req.NodeId, err)
		}
	}
	ttl := s.cfg.TokenTTL
	if req.TtlSeconds < 0 {
		return nil, refused(codes.InvalidArgument, "ttl must be positive")
	}
	if req.TtlSeconds > 0 {
		ttl = time.Duration(req.TtlSeconds) * time.Second
	}
	if ttl > s.cfg.MaxTokenTTL {
		return nil, refused(codes.InvalidArgument, "ttl %s is longer than max_token_ttl (%s)", ttl, s.cfg.MaxTokenTTL)
	}
	secret, hash, id, err := NewToken()
	if err != nil {
		return nil, unavailable("make token", "make token; retry", err)
	}
	now := s.cfg.Now()
	t := store.Token{
		ID: id, Hash: hash, Role: req.Role, Site: req.Site, NodeID: req.NodeId,
		AllowReclaim: req.AllowReclaim, RequireApproval: req.RequireApproval,
		CreatedBy: adminName(ctx), CreatedAt: now, ExpiresAt: now.Add(ttl),
	}
	if err := s.cfg.Store.CreateToken(ctx, t); err != nil {
		return nil, storeFailure("create token", err)
	}
	_ = s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: now, Actor: "admin:" + t.CreatedBy, Action: "token.create", Subject: "token:" + id,
		Detail: fmt.Sprintf("role %s site %s node %s reclaim %t expires %s", t.Role, t.Site, t.NodeID, t.AllowReclaim, t.ExpiresAt.UTC().Format(time.RFC3339))})
	s.log.InfoContext(ctx, "token created", logkey.TokenID, id, logkey.Admin, t.CreatedBy, "role", t.Role)
	return &adminv1.CreateTokenResponse{Token: secret, Info: tokenInfo(t)}, nil
}

// NewToken makes a join token: the secret to hand out once, the SHA-256
// the store keeps, and the short public id derived from that hash.
func NewToken() (secret string, hash []byte, id string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", nil, "", fmt.Errorf("read random: %w", err)
	}
	secret = TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	h := sha256.Sum256([]byte(secret))
	return secret, h[:], hex.EncodeToString(h[:6]), nil
}

func (a *adminService) ListTokens(ctx context.Context, _ *adminv1.ListTokensRequest) (*adminv1.ListTokensResponse, error) {
	ts, err := a.s.cfg.Store.ListTokens(ctx)
	if err != nil {
		return nil, storeFailure("list tokens", err)
	}
	out := &adminv1.ListTokensResponse{}
	for _, t := range ts {
		out.Tokens = append(out.Tokens, tokenInfo(t))
	}
	return out, nil
}

func (a *adminService) ListNodes(ctx context.Context, _ *adminv1.ListNodesRequest) (*adminv1.ListNodesResponse, error) {
	ns, err := a.s.cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, storeFailure("list nodes", err)
	}
	out := &adminv1.ListNodesResponse{}
	for _, n := range ns {
		out.Nodes = append(out.Nodes, nodeInfo(n))
	}
	return out, nil
}

func (a *adminService) GetNode(ctx context.Context, req *adminv1.GetNodeRequest) (*adminv1.GetNodeResponse, error) {
	n, err := a.s.cfg.Store.GetNode(ctx, req.Id)
	if err != nil {
		return nil, storeFailure("get node "+req.Id, err)
	}
	return &adminv1.GetNodeResponse{Node: nodeInfo(n)}, nil
}

func unix(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

func tokenInfo(t store.Token) *adminv1.Token {
	return &adminv1.Token{
		Id: t.ID, Role: t.Role, Site: t.Site, NodeId: t.NodeID, AllowReclaim: t.AllowReclaim,
		RequireApproval: t.RequireApproval, CreatedUnix: unix(t.CreatedAt), ExpiresUnix: unix(t.ExpiresAt),
		UsedUnix: unix(t.UsedAt), UsedByNode: t.UsedBy, CreatedBy: t.CreatedBy,
	}
}

func nodeInfo(n store.Node) *adminv1.Node {
	return &adminv1.Node{
		Id: n.ID, SpiffeId: n.SPIFFEID, Role: n.Role, Site: n.Site, State: n.State,
		IdentityGeneration: n.Generation, Attestor: n.Attestor, Hostname: n.Claims.Hostname,
		ProductUuid: n.Claims.ProductUUID, Serials: n.Claims.Serials, Macs: n.Claims.MACs,
		GpuUuids: n.Claims.GPUUUIDs, DaemonVersion: n.DaemonVersion, JoinedUnix: unix(n.JoinedAt),
		LastSeenUnix: unix(n.LastSeen), CertSerial: n.CertSerial, CertNotAfterUnix: unix(n.CertNotAfter),
	}
}

func (a *adminService) RevokeNode(ctx context.Context, req *adminv1.RevokeNodeRequest) (*adminv1.RevokeNodeResponse, error) {
	reason, err := revokeReason(req.Reason)
	if err != nil {
		return nil, err
	}
	gen, serials, notified, err := a.s.revokeNode(ctx, req.Id, reason, false)
	if err != nil {
		return nil, storeFailure("revoke node "+req.Id, err)
	}
	return &adminv1.RevokeNodeResponse{IdentityGeneration: gen, RevokedSerials: serials, SessionNotified: notified}, nil
}

func (a *adminService) DeleteNode(ctx context.Context, req *adminv1.DeleteNodeRequest) (*adminv1.DeleteNodeResponse, error) {
	reason := req.Reason
	if reason == "" {
		reason = "node deleted"
	}
	reason, err := revokeReason(reason)
	if err != nil {
		return nil, err
	}
	_, serials, notified, err := a.s.revokeNode(ctx, req.Id, reason, true)
	if err != nil {
		return nil, storeFailure("delete node "+req.Id, err)
	}
	return &adminv1.DeleteNodeResponse{RevokedSerials: serials, SessionNotified: notified}, nil
}

// revokeReason checks an operator's reason: required, one line, bounded.
func revokeReason(r string) (string, error) {
	r = strings.TrimSpace(r)
	switch {
	case r == "":
		return "", refused(codes.InvalidArgument, "a revocation needs a reason (--reason)")
	case len(r) > 256 || strings.ContainsAny(r, "\n\r"):
		return "", refused(codes.InvalidArgument, "the reason must be one line of at most 256 bytes")
	}
	return r, nil
}

func (a *adminService) ApproveNode(ctx context.Context, req *adminv1.ApproveNodeRequest) (*adminv1.ApproveNodeResponse, error) {
	now := a.s.cfg.Now()
	ps, err := a.s.cfg.Store.ApprovePending(ctx, req.Id, adminName(ctx), now)
	if errors.Is(err, store.ErrNotFound) {
		return nil, refused(codes.NotFound, "no join of node %s is waiting for approval (see fleetd nodes pending)", req.Id)
	}
	if err != nil {
		return nil, storeFailure("approve node "+req.Id, err)
	}
	_ = a.s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: now, Actor: actorOf(ctx), Action: "node.approve", Subject: req.Id, Detail: fmt.Sprintf("%d pending joins approved", len(ps))})
	a.s.log.InfoContext(ctx, "join approved", logkey.NodeID, req.Id, logkey.Admin, adminName(ctx))
	return &adminv1.ApproveNodeResponse{Approved: uint32(len(ps))}, nil
}

func (a *adminService) ListPending(ctx context.Context, _ *adminv1.ListPendingRequest) (*adminv1.ListPendingResponse, error) {
	ps, err := a.s.cfg.Store.ListPending(ctx, a.s.cfg.Now())
	if err != nil {
		return nil, storeFailure("list pending joins", err)
	}
	out := &adminv1.ListPendingResponse{}
	for _, p := range ps {
		out.Pending = append(out.Pending, &adminv1.PendingJoin{
			NodeId: p.NodeID, Role: p.Role, Site: p.Site, Hostname: p.Claims.Hostname, TokenId: p.TokenID,
			CreatedUnix: unix(p.CreatedAt), ExpiresUnix: unix(p.ExpiresAt), Approved: !p.ApprovedAt.IsZero(),
		})
	}
	return out, nil
}
