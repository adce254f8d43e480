package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
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
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
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

// adminIdentity is the admin credential a call came with.
type adminIdentity struct {
	name   string
	role   roles.Role
	serial string
}

// adminActions says what each Admin method does, for the role check; a
// method missing here is refused to everyone (TestEveryAdminMethodHasARule).
var adminActions = map[string]func(req any) roles.Action{
	"CreateToken":      fixed(roles.CreateToken),
	"ListTokens":       fixed(roles.ReadFleet),
	"ListNodes":        fixed(roles.ReadFleet),
	"GetNode":          fixed(roles.ReadFleet),
	"RevokeNode":       fixed(roles.Lifecycle),
	"DeleteNode":       fixed(roles.Retire),
	"ApproveNode":      fixed(roles.Lifecycle),
	"ListPending":      fixed(roles.ReadFleet),
	"CreateAdmin":      fixed(roles.ManageAdmins),
	"ListAdmins":       fixed(roles.ReadAdmins),
	"RevokeAdmin":      fixed(roles.ManageAdmins),
	"ListDeclarations": fixed(roles.ReadInventory),
	"ListChanges":      fixed(roles.ReadInventory),
	"ListClaims":       fixed(roles.ReadFleet),
	"NodeHistory":      fixed(roles.ReadFleet),
	"ListVerdicts":     fixed(roles.ReadFleet),
	// The export endpoints on the HTTPS listener (export.go).
	"ExportRegistrations": fixed(roles.ReadExport),
	"ExportHolds":         fixed(roles.ReadExport),
	"ExportAllowed":       fixed(roles.ApplyExport),
	"ExportAllow":         fixed(roles.AllowExport),
	"ExportRun":           fixed(roles.ApplyExport),
	"ListCerts":           fixed(roles.ReadFleet),
	"CheckNode":           fixed(roles.Lifecycle),
	"GetBootEvidence":     fixed(roles.ReadFleet),
	"PolicyStatus":        fixed(roles.ReadFleet),
	"ListAudit":           fixed(roles.ReadFleet),
	"ApplyInventory": func(req any) roles.Action {
		if r, ok := req.(*adminv1.ApplyInventoryRequest); ok && r.DryRun {
			return roles.ReadInventory
		}
		return roles.WriteInventory
	},
	"TransitionNode": func(req any) roles.Action {
		if r, ok := req.(*adminv1.TransitionNodeRequest); ok {
			if t, ok := transitionByName(r.Action); ok {
				return t.Action
			}
		}
		return roles.Lifecycle
	},
}

func fixed(a roles.Action) func(any) roles.Action { return func(any) roles.Action { return a } }

// authorizeAdmin lets Admin calls through only with a valid, unrevoked
// admin credential whose role may do what the call does, and audits each
// call with the credential's name; other services pass untouched.
func (s *Server) authorizeAdmin(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	method, ok := strings.CutPrefix(info.FullMethod, "/"+adminv1.Admin_ServiceDesc.ServiceName+"/")
	if !ok {
		return h(ctx, req)
	}
	id, err := s.adminFromPeer(ctx)
	if err != nil {
		return nil, err
	}
	ctx, finish, err := s.admitAdmin(ctx, id, method, req)
	if err != nil {
		return nil, err
	}
	resp, err := h(ctx, req)
	finish(err)
	return resp, err
}

// admitAdmin checks that the credential id may make the call of method
// with req (an Admin method's role rule), and audits and counts a
// refusal. It returns the call's context, which carries id, and finish,
// which audits and counts the call's outcome.
func (s *Server) admitAdmin(ctx context.Context, id adminIdentity, method string, req any) (context.Context, func(error), error) {
	rule, ok := adminActions[method]
	if !ok {
		return nil, nil, refused(codes.PermissionDenied, "Admin method %s has no role rule", method)
	}
	action := rule(req)
	now := s.cfg.Now()
	if !id.role.May(action) {
		msg := roles.Refusal(id.name, id.role, action)
		_ = s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: now, Actor: "admin:" + id.name, Action: "admin.refused", Subject: method, Detail: msg})
		s.metrics.adminCall(method, "refused")
		s.log.WarnContext(ctx, "admin call refused", logkey.Admin, id.name, "role", string(id.role), "method", method)
		return nil, nil, refused(codes.PermissionDenied, "%s", msg)
	}
	finish := func(err error) {
		outcome := codeOf(err).String()
		s.metrics.adminCall(method, outcome)
		_ = s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: now, Actor: "admin:" + id.name, Action: "admin.call", Subject: method,
			Detail: fmt.Sprintf("role %s: %s", id.role, outcome)})
	}
	return context.WithValue(ctx, adminKey{}, id), finish, nil
}

// adminFromPeer finds the admin credential of the call's TLS connection:
// a client certificate of the admin CA that names a credential and role,
// or (from a PKI made before the admin CA) the serving CA's owner
// credential, which has role owner. The credential must not be revoked; a
// valid one fleetd has not recorded yet (the owner credential of fleetd
// init) is recorded at its first call.
func (s *Server) adminFromPeer(ctx context.Context) (adminIdentity, error) {
	none := refused(codes.Unauthenticated, "admin calls need the admin client certificate from 'fleetd init' (admin/owner.crt), or a credential from fleetd admin create (--credential DIR)")
	p, ok := peer.FromContext(ctx)
	if !ok {
		return adminIdentity{}, none
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return adminIdentity{}, none
	}
	return s.adminFromChains(ctx, ti.State.VerifiedChains, none)
}

// adminFromChains is adminFromPeer's check of a connection's verified
// chains (the HTTPS listener's export endpoints use it too); none is the
// refusal when no chain names an admin credential.
func (s *Server) adminFromChains(ctx context.Context, chains [][]*x509.Certificate, none error) (adminIdentity, error) {
	a := s.cfg.Authority
	for _, chain := range chains {
		if len(chain) < 2 {
			continue
		}
		var id adminIdentity
		switch {
		case a.AdminCA != nil && chain[1].Equal(a.AdminCA):
			info, err := pki.ParseAdminCert(chain[0], a.TrustDomain)
			if err != nil {
				return adminIdentity{}, refused(codes.Unauthenticated, "admin credential: %v", err)
			}
			r, err := roles.Parse(info.Role)
			if err != nil {
				return adminIdentity{}, refused(codes.Unauthenticated, "admin credential %s: %v", info.Name, err)
			}
			id = adminIdentity{name: info.Name, role: r}
		case chain[1].Equal(a.ServingCA):
			name, ok := pki.AdminIdentity(chain[0], a.TrustDomain)
			if !ok {
				continue
			}
			// The owner credential of a PKI made before the admin CA.
			id = adminIdentity{name: name, role: roles.Owner}
		default:
			continue
		}
		id.serial = pki.SerialHex(chain[0])
		return id, s.checkAdminRecord(ctx, id, chain[0].NotAfter)
	}
	return adminIdentity{}, none
}

// checkAdminRecord refuses a revoked credential, or one whose record names
// another name or role, and records one seen for the first time.
func (s *Server) checkAdminRecord(ctx context.Context, id adminIdentity, notAfter time.Time) error {
	rec, err := s.cfg.Store.GetAdmin(ctx, id.serial)
	if errors.Is(err, store.ErrNotFound) {
		now := s.cfg.Now()
		rec = store.AdminCred{Serial: id.serial, Name: id.name, Role: string(id.role), CreatedBy: "fleetd (first seen)", CreatedAt: now, NotAfter: notAfter}
		err = s.cfg.Store.CreateAdmin(ctx, rec, &store.AuditEvent{Time: now, Actor: "fleetd", Action: "admin.recorded", Subject: "admin:" + id.name,
			Detail: fmt.Sprintf("credential %s with role %s seen for the first time", id.serial, id.role)})
		if errors.Is(err, store.ErrConflict) {
			rec, err = s.cfg.Store.GetAdmin(ctx, id.serial)
			if errors.Is(err, store.ErrNotFound) {
				return refused(codes.Unauthenticated, "admin credential %s: another unrevoked credential named %s exists; revoke it (fleetd admin revoke %s) or use it", id.serial, id.name, id.name)
			}
		}
	}
	if err != nil {
		return storeFailure("check the admin credential", err)
	}
	switch {
	case !rec.RevokedAt.IsZero():
		return refused(codes.Unauthenticated, "admin credential %s (%s) was revoked at %s by %s", id.name, id.serial, rec.RevokedAt.UTC().Format(time.RFC3339), rec.RevokedBy)
	case rec.Name != id.name || rec.Role != string(id.role):
		return refused(codes.Unauthenticated, "admin credential %s names %s with role %s, its record %s with role %s", id.serial, id.name, id.role, rec.Name, rec.Role)
	}
	return nil
}

func adminOf(ctx context.Context) adminIdentity {
	id, _ := ctx.Value(adminKey{}).(adminIdentity)
	return id
}

func adminName(ctx context.Context) string { return adminOf(ctx).name }

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
		Class: n.Class, EkPin: n.EKPin,
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
	if n, err := a.s.cfg.Store.GetNode(ctx, req.Id); err == nil && n.State == store.StateRetired {
		// Its record is what keeps a declared machine from being planned
		// again under the same name.
		return nil, refused(codes.FailedPrecondition, "node %s is retired: its record stays; a retired machine comes back only declared again under a new name", req.Id)
	}
	_, serials, notified, err := a.s.revokeNode(ctx, req.Id, reason, true)
	if err != nil {
		return nil, storeFailure("delete node "+req.Id, err)
	}
	return &adminv1.DeleteNodeResponse{RevokedSerials: serials, SessionNotified: notified}, nil
}

// revokeReason checks an operator's reason: required, one line, bounded.
func revokeReason(r string) (string, error) {
	if strings.TrimSpace(r) == "" {
		return "", refused(codes.InvalidArgument, "a revocation needs a reason (--reason)")
	}
	r, err := lifecycle.CheckReason(r)
	if err != nil {
		return "", refused(codes.InvalidArgument, "%v", err)
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
