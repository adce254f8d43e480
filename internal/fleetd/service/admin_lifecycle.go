package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
)

// Limits of the admin calls of this file.
const (
	defaultAdminTTL = 90 * 24 * time.Hour
	defaultListSize = 1000
	maxListSize     = 10000
)

func listLimit(n uint32) int {
	switch {
	case n == 0:
		return defaultListSize
	case n > maxListSize:
		return maxListSize
	}
	return int(n)
}

func (a *adminService) CreateAdmin(ctx context.Context, req *adminv1.CreateAdminRequest) (*adminv1.CreateAdminResponse, error) {
	s := a.s
	auth := s.cfg.Authority
	if auth.AdminCA == nil || auth.AdminSigner == nil {
		return nil, refused(codes.FailedPrecondition, "this PKI directory was made before the admin CA: run fleetd init --dir PKI_DIR --add-admin-ca, then restart fleetd")
	}
	if err := pki.ValidNodeID(req.Name); err != nil {
		return nil, refused(codes.InvalidArgument, "admin name: %v", err)
	}
	role, err := roles.Parse(req.Role)
	if err != nil {
		return nil, refused(codes.InvalidArgument, "%v", err)
	}
	csr, err := pki.ParseCSR(req.Csr)
	if err != nil {
		return nil, refused(codes.InvalidArgument, "the credential's request: %v", err)
	}
	ttl := defaultAdminTTL
	if req.TtlSeconds < 0 {
		return nil, refused(codes.InvalidArgument, "ttl must be positive")
	}
	if req.TtlSeconds > 0 {
		ttl = time.Duration(req.TtlSeconds) * time.Second
	}
	now := s.cfg.Now()
	cert, err := pki.IssueAdminCert(auth.AdminCA, auth.AdminSigner, pki.AdminCertRequest{PublicKey: csr.PublicKey, TrustDomain: auth.TrustDomain,
		Name: req.Name, Role: string(role), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl)})
	if err != nil {
		return nil, unavailable("create admin", "the credential could not be issued; retry", err)
	}
	by := adminName(ctx)
	rec := store.AdminCred{Serial: pki.SerialHex(cert), Name: req.Name, Role: string(role), CreatedBy: by, CreatedAt: now, NotAfter: cert.NotAfter}
	err = s.cfg.Store.CreateAdmin(ctx, rec, &store.AuditEvent{Time: now, Actor: "admin:" + by, Action: "admin.create", Subject: "admin:" + req.Name,
		Detail: fmt.Sprintf("role %s serial %s until %s", role, rec.Serial, cert.NotAfter.UTC().Format(time.RFC3339))})
	if errors.Is(err, store.ErrConflict) {
		return nil, refused(codes.AlreadyExists, "an unrevoked admin credential named %s exists: revoke it first (fleetd admin revoke %s)", req.Name, req.Name)
	}
	if err != nil {
		return nil, storeFailure("create admin "+req.Name, err)
	}
	s.log.InfoContext(ctx, "admin credential created", logkey.Admin, by, "name", req.Name, "role", string(role), logkey.Serial, rec.Serial)
	return &adminv1.CreateAdminResponse{Certificate: cert.Raw, AdminCa: auth.AdminCA.Raw, Admin: adminInfo(rec)}, nil
}

func adminInfo(c store.AdminCred) *adminv1.AdminCredential {
	return &adminv1.AdminCredential{Name: c.Name, Role: c.Role, Serial: c.Serial, CreatedBy: c.CreatedBy, CreatedUnix: unix(c.CreatedAt),
		NotAfterUnix: unix(c.NotAfter), RevokedUnix: unix(c.RevokedAt), RevokedBy: c.RevokedBy}
}

func (a *adminService) ListAdmins(ctx context.Context, _ *adminv1.ListAdminsRequest) (*adminv1.ListAdminsResponse, error) {
	cs, err := a.s.cfg.Store.ListAdmins(ctx)
	if err != nil {
		return nil, storeFailure("list admins", err)
	}
	out := &adminv1.ListAdminsResponse{}
	for _, c := range cs {
		out.Admins = append(out.Admins, adminInfo(c))
	}
	return out, nil
}

func (a *adminService) RevokeAdmin(ctx context.Context, req *adminv1.RevokeAdminRequest) (*adminv1.RevokeAdminResponse, error) {
	reason, err := lifecycle.CheckReason(req.Reason)
	if err != nil {
		return nil, refused(codes.InvalidArgument, "%v", err)
	}
	by := adminName(ctx)
	if req.Name == by {
		return nil, refused(codes.FailedPrecondition, "admin %s would revoke its own credential: revoke it with another owner's", by)
	}
	now := a.s.cfg.Now()
	cs, err := a.s.cfg.Store.RevokeAdmin(ctx, req.Name, by, now, &store.AuditEvent{Time: now, Actor: "admin:" + by, Action: "admin.revoke", Subject: "admin:" + req.Name, Detail: reason})
	if errors.Is(err, store.ErrNotFound) {
		return nil, refused(codes.NotFound, "no unrevoked admin credential is named %s (see fleetd admin list)", req.Name)
	}
	if err != nil {
		return nil, storeFailure("revoke admin "+req.Name, err)
	}
	a.s.log.InfoContext(ctx, "admin credential revoked", logkey.Admin, by, "name", req.Name, logkey.Reason, reason)
	out := &adminv1.RevokeAdminResponse{}
	for _, c := range cs {
		out.Revoked = append(out.Revoked, adminInfo(c))
	}
	return out, nil
}

// ApplyInventory takes the inventory file in pieces (each within the
// per-message limit, at most inventory.MaxFileBytes in all), from a caller
// whose credential may plan (dry_run) or apply: the credential is checked
// before any piece is read, its role with the first.
func (a *adminService) ApplyInventory(stream adminv1.Admin_ApplyInventoryServer) error {
	s := a.s
	ctx := stream.Context()
	id, err := s.adminFromPeer(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ctx, finish, err := s.admitAdmin(ctx, id, "ApplyInventory", first)
	if err != nil {
		return err
	}
	file := first.Chunk
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			finish(err)
			return err
		}
		if len(file)+len(m.Chunk) > inventory.MaxFileBytes {
			err := refused(codes.InvalidArgument, "the inventory file is larger than %d bytes", inventory.MaxFileBytes)
			finish(err)
			return err
		}
		file = append(file, m.Chunk...)
	}
	resp, err := a.applyInventory(ctx, file, first.DryRun)
	finish(err)
	if err != nil {
		return err
	}
	return stream.SendAndClose(resp)
}

// applyInventory plans (dryRun) or applies an inventory file.
func (a *adminService) applyInventory(ctx context.Context, data []byte, dryRun bool) (*adminv1.ApplyInventoryResponse, error) {
	s := a.s
	if _, ok := s.cfg.Inventory.(inventory.StoreSource); !ok && !dryRun {
		return nil, refused(codes.FailedPrecondition, "declarations come from %s ([inventory] source): declare machines there", s.cfg.Inventory.Name())
	}
	desired, err := inventory.Parse(data, s.cfg.InventoryClasses)
	if err != nil {
		return nil, refused(codes.InvalidArgument, "%v", err)
	}
	current, err := s.cfg.Store.ListDeclarations(ctx)
	if err != nil {
		return nil, storeFailure("read the inventory", err)
	}
	states, err := s.nodeStates(ctx)
	if err != nil {
		return nil, err
	}
	id := adminOf(ctx)
	reqID := newRequestID()
	now := s.cfg.Now()
	unauthored, err := s.unauthoredBindings(ctx, current, desired, id.role)
	if err != nil {
		return nil, err
	}
	plan := inventory.MakePlan(current, states, desired, inventory.Writer{Name: id.name, Role: id.role}, now, reqID, unauthored)
	out := &adminv1.ApplyInventoryResponse{Added: uint32(plan.Added), Updated: uint32(plan.Updated), Unchanged: uint32(plan.Unchanged),
		Retired: uint32(plan.Retired), Missing: uint32(plan.Missing), RequestId: reqID}
	for _, d := range plan.Devices {
		if d.Kind == inventory.KindUnchanged {
			continue
		}
		dc := &adminv1.DeviceChange{Device: d.Device, Kind: d.Kind, Warnings: d.Warnings}
		for _, f := range d.Fields {
			dc.Fields = append(dc.Fields, &adminv1.FieldDiff{Field: f.Field, Old: f.Old, New: f.New})
		}
		out.Changes = append(out.Changes, dc)
	}
	if dryRun || plan.Empty() {
		return out, nil
	}
	err = s.cfg.Store.ApplyInventory(ctx, store.InventoryWrite{Writes: plan.Writes, Changes: plan.Changes,
		Audit: &store.AuditEvent{Time: now, Actor: "admin:" + id.name, Action: "inventory.apply", Subject: "inventory",
			Detail: fmt.Sprintf("request %s: %d added, %d updated, %d field changes", reqID, plan.Added, plan.Updated, len(plan.Changes))}})
	if errors.Is(err, store.ErrConflict) {
		return nil, refused(codes.Aborted, "the inventory changed while this apply ran: nothing was written; run it again")
	}
	if err != nil {
		return nil, storeFailure("apply the inventory", err)
	}
	out.Applied = true
	s.log.InfoContext(ctx, "inventory applied", logkey.Admin, id.name, logkey.RequestID, reqID, "added", plan.Added, "updated", plan.Updated, "changes", len(plan.Changes))
	return out, nil
}

// unauthoredBindings names, for a declarer's apply, the devices whose
// binding the file leaves as it is but a declarer did not write last.
func (s *Server) unauthoredBindings(ctx context.Context, current, desired []store.Declaration, role roles.Role) (map[string]bool, error) {
	if role != roles.Declarer {
		return nil, nil
	}
	cur := make(map[string]store.Declaration, len(current))
	for _, d := range current {
		cur[d.Name] = d
	}
	src := inventory.StoreSource{Store: s.cfg.Store}
	out := map[string]bool{}
	for _, d := range desired {
		old, ok := cur[d.Name]
		if !ok || len(d.EKPins) == 0 || !slices.Equal(old.EKPins, d.EKPins) || old.EKSource != d.EKSource || old.EKReference != d.EKReference {
			continue
		}
		auth, err := src.Binding(ctx, old)
		if err != nil {
			return nil, storeFailure("read the binding of "+d.Name, err)
		}
		if !auth.Honoured {
			out[d.Name] = true
		}
	}
	return out, nil
}

// nodeStates maps each node id to its state.
func (s *Server) nodeStates(ctx context.Context) (map[string]string, error) {
	ns, err := s.cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, storeFailure("list nodes", err)
	}
	states := make(map[string]string, len(ns))
	for _, n := range ns {
		states[n.ID] = n.State
	}
	return states, nil
}

func (a *adminService) ListDeclarations(ctx context.Context, _ *adminv1.ListDeclarationsRequest) (*adminv1.ListDeclarationsResponse, error) {
	s := a.s
	src, ok := s.cfg.Inventory.(inventory.StoreSource)
	if !ok {
		return nil, refused(codes.FailedPrecondition, "declarations come from %s ([inventory] source): list them there", s.cfg.Inventory.Name())
	}
	ds, err := s.cfg.Store.ListDeclarations(ctx)
	if err != nil {
		return nil, storeFailure("list declarations", err)
	}
	states, err := s.nodeStates(ctx)
	if err != nil {
		return nil, err
	}
	out := &adminv1.ListDeclarationsResponse{Source: src.Name()}
	for _, d := range ds {
		st := states[d.Name]
		if st == "" {
			st = store.StatePlanned
		}
		pd := &adminv1.Declaration{Name: d.Name, Serial: d.Serial, ProductUuid: d.ProductUUID, Macs: d.MACs, Class: d.Class, Site: d.Site,
			Role: d.Role, SwitchChassis: d.SwitchChassis, SwitchPort: d.SwitchPort, EkPins: d.EKPins, EkSource: d.EKSource,
			EkReference: d.EKReference, Version: d.Version, State: st, InstallDisk: d.InstallDisk}
		if len(d.EKPins) > 0 {
			auth, err := src.Binding(ctx, d)
			if err != nil {
				return nil, storeFailure("read the binding of "+d.Name, err)
			}
			pd.BindingHonoured, pd.Binding = auth.Honoured, auth.Why
		}
		out.Declarations = append(out.Declarations, pd)
	}
	return out, nil
}

func (a *adminService) ListChanges(ctx context.Context, req *adminv1.ListChangesRequest) (*adminv1.ListChangesResponse, error) {
	cs, err := a.s.cfg.Store.ListChanges(ctx, req.Device, listLimit(req.Limit))
	if err != nil {
		return nil, storeFailure("list changes", err)
	}
	out := &adminv1.ListChangesResponse{}
	for _, c := range cs {
		out.Changes = append(out.Changes, &adminv1.FieldChange{TimeUnix: unix(c.Time), Device: c.Device, Field: c.Field, Old: c.Old, New: c.New,
			Actor: c.Actor, ActorRole: c.ActorRole, RequestId: c.RequestID, Source: c.Source})
	}
	return out, nil
}

func (a *adminService) ListClaims(ctx context.Context, req *adminv1.ListClaimsRequest) (*adminv1.ListClaimsResponse, error) {
	cs, err := a.s.cfg.Store.ListClaims(ctx, listLimit(req.Limit))
	if err != nil {
		return nil, storeFailure("list claims", err)
	}
	out := &adminv1.ListClaimsResponse{}
	for _, c := range cs {
		out.Claims = append(out.Claims, &adminv1.Claim{Key: c.Key, Attestor: c.Attestor, EkPin: c.EKPin, ProductUuid: c.ProductUUID,
			Serials: c.Serials, Macs: c.MACs, Hostname: c.Hostname, Peer: c.Peer, Reason: c.Reason, Declared: c.Declared,
			FirstSeenUnix: unix(c.FirstSeen), LastSeenUnix: unix(c.LastSeen), Count: c.Count})
	}
	return out, nil
}

func transitionByName(name string) (lifecycle.Transition, bool) {
	for _, t := range lifecycle.Transitions {
		if t.Name == name {
			return t, true
		}
	}
	return lifecycle.Transition{}, false
}

func (a *adminService) TransitionNode(ctx context.Context, req *adminv1.TransitionNodeRequest) (*adminv1.TransitionNodeResponse, error) {
	s := a.s
	t, ok := transitionByName(req.Action)
	if !ok {
		names := make([]string, len(lifecycle.Transitions))
		for i, t := range lifecycle.Transitions {
			names[i] = t.Name
		}
		return nil, refused(codes.InvalidArgument, "action %q is not one of %s", req.Action, strings.Join(names, ", "))
	}
	by := adminName(ctx)
	res, err := s.lifecycle.Do(ctx, t, req.Id, "admin:"+by, req.Reason, newRequestID())
	if err != nil {
		return nil, lifecycleError(req.Id, err)
	}
	s.metrics.transition(t.Name)
	s.log.InfoContext(ctx, "node "+t.Name, logkey.NodeID, req.Id, logkey.Admin, by, logkey.Reason, req.Reason, "state", res.Node.State)
	out := &adminv1.TransitionNodeResponse{Node: nodeInfo(res.Node), RevokedSerials: res.Revoked, SessionNotified: res.SessionNotified}
	for _, e := range res.HookErrors {
		s.log.ErrorContext(ctx, "lifecycle hook failed", "action", t.Name, logkey.NodeID, req.Id, logkey.Error, e)
		out.Warnings = append(out.Warnings, e.Error())
	}
	return out, nil
}

// lifecycleError is a lifecycle action's failure as the caller sees it.
func lifecycleError(id string, err error) error {
	var se *lifecycle.StateError
	switch {
	case errors.As(err, &se):
		return refused(codes.FailedPrecondition, "%v", se)
	case errors.Is(err, lifecycle.ErrUnknown):
		return refused(codes.NotFound, "%s is neither a node nor a declared device (see fleetd nodes list, fleetd inventory list)", id)
	case errors.Is(err, lifecycle.ErrSourceUnavailable):
		return unavailable("lifecycle", "the inventory source cannot answer; retry", err, logkey.NodeID, id)
	case errors.Is(err, lifecycle.ErrReason):
		return refused(codes.InvalidArgument, "%v", err)
	}
	return storeFailure("change node "+id, err)
}

func (a *adminService) NodeHistory(ctx context.Context, req *adminv1.NodeHistoryRequest) (*adminv1.NodeHistoryResponse, error) {
	s := a.s
	hs, err := s.cfg.Store.NodeHistory(ctx, req.Id)
	if err != nil {
		return nil, storeFailure("node history of "+req.Id, err)
	}
	out := &adminv1.NodeHistoryResponse{}
	n, err := s.cfg.Store.GetNode(ctx, req.Id)
	switch {
	case err == nil:
		out.State = n.State
	case !errors.Is(err, store.ErrNotFound):
		return nil, storeFailure("get node "+req.Id, err)
	default:
		if _, derr := s.cfg.Inventory.Get(ctx, req.Id); derr == nil {
			out.State = store.StatePlanned
		} else if errors.Is(derr, store.ErrNotFound) && len(hs) == 0 {
			return nil, refused(codes.NotFound, "%s is neither a node nor a declared device", req.Id)
		}
	}
	for _, h := range hs {
		out.Changes = append(out.Changes, &adminv1.StateChange{TimeUnix: unix(h.Time), From: h.From, To: h.To, Actor: h.Actor, Reason: h.Reason, RequestId: h.RequestID})
	}
	return out, nil
}

// maxVerdictsListed bounds a ListVerdicts answer.
const maxVerdictsListed = 1000

func (a *adminService) ListVerdicts(ctx context.Context, req *adminv1.ListVerdictsRequest) (*adminv1.ListVerdictsResponse, error) {
	if req.NodeId == "" {
		return nil, refused(codes.InvalidArgument, "name the node whose verdicts to list")
	}
	limit := int(req.Limit)
	if limit == 0 {
		limit = 100
	}
	limit = min(limit, maxVerdictsListed)
	vs, err := a.s.cfg.Store.ListVerdicts(ctx, req.NodeId, limit)
	if err != nil {
		return nil, storeFailure("verdicts of node "+req.NodeId, err)
	}
	out := &adminv1.ListVerdictsResponse{}
	for _, v := range vs {
		out.Verdicts = append(out.Verdicts, verdictInfo(v))
	}
	return out, nil
}

// maxCertsListed bounds a ListCerts answer.
const maxCertsListed = 1000

func (a *adminService) ListCerts(ctx context.Context, req *adminv1.ListCertsRequest) (*adminv1.ListCertsResponse, error) {
	if req.NodeId == "" {
		return nil, refused(codes.InvalidArgument, "name the node whose certificates to list")
	}
	limit := int(min(req.Limit, maxCertsListed))
	if limit == 0 {
		limit = 100
	}
	cs, err := a.s.cfg.Store.ListCerts(ctx, req.NodeId, limit)
	if err != nil {
		return nil, storeFailure("certificates of node "+req.NodeId, err)
	}
	out := &adminv1.ListCertsResponse{}
	for _, c := range cs {
		out.Certs = append(out.Certs, &adminv1.CertInfo{Serial: c.Serial, NodeId: c.NodeID, Generation: c.Generation, Kind: c.Kind,
			IssuedUnix: unix(c.IssuedAt), NotAfterUnix: unix(c.NotAfter), RevokedUnix: unix(c.RevokedAt), RevokedReason: c.RevokedReason})
	}
	return out, nil
}

// verdictInfo is a stored verdict on the wire.
func verdictInfo(v store.Verdict) *adminv1.Verdict {
	out := &adminv1.Verdict{NodeId: v.NodeID, TimeUnixNano: v.Time.UnixNano(), Stage: v.Stage, Class: v.Class, Passed: v.Passed,
		NonceSha256: v.NonceSHA256, QuoteSha256: v.QuoteSHA256, PolicySha256: v.Policy, Matched: v.Matched}
	for _, f := range v.Failed {
		out.Failed = append(out.Failed, &adminv1.FailedRule{Rule: f.Rule, Reason: f.Reason})
	}
	return out
}
func (a *adminService) ListAudit(ctx context.Context, req *adminv1.ListAuditRequest) (*adminv1.ListAuditResponse, error) {
	limit := listLimit(req.Limit)
	scan := limit
	if req.Subject != "" {
		// A subject's events are found among the latest maxListSize.
		scan = maxListSize
	}
	es, err := a.s.cfg.Store.ListAudit(ctx, scan)
	if err != nil {
		return nil, storeFailure("list audit", err)
	}
	out := &adminv1.ListAuditResponse{}
	for _, e := range es {
		if req.Subject != "" && e.Subject != req.Subject {
			continue
		}
		out.Events = append(out.Events, &adminv1.AuditEvent{TimeUnix: unix(e.Time), Actor: e.Actor, Action: e.Action, Subject: e.Subject, Detail: e.Detail})
		if len(out.Events) == limit {
			break
		}
	}
	return out, nil
}

func (a *adminService) GetBootEvidence(ctx context.Context, req *adminv1.GetBootEvidenceRequest) (*adminv1.GetBootEvidenceResponse, error) {
	if req.NodeId == "" {
		return nil, refused(codes.InvalidArgument, "name the node whose boot evidence to get")
	}
	e, err := a.s.cfg.Store.GetBootEvidence(ctx, req.NodeId)
	if errors.Is(err, store.ErrNotFound) {
		return nil, refused(codes.NotFound, "no boot evidence of node %s is kept: fleetd keeps a node's last verified evidence from its tpm join, attested renewals and boot checks (fleetd nodes check %s asks for one now)", req.NodeId, req.NodeId)
	}
	if err != nil {
		return nil, storeFailure("boot evidence of node "+req.NodeId, err)
	}
	pcrs := make(map[uint32][]byte, len(e.PCRs))
	for i, v := range e.PCRs {
		pcrs[uint32(i)] = v
	}
	return &adminv1.GetBootEvidenceResponse{Evidence: &adminv1.BootEvidence{
		NodeId: e.NodeID, TimeUnixNano: e.Time.UnixNano(), Stage: e.Stage, Class: e.Class, Passed: e.Passed,
		Pcrs: pcrs, EventLog: e.EventLog, AkPublic: e.AKPublic, QuoteAttest: e.QuoteAttest, QuoteSignature: e.QuoteSignature, Nonce: e.Nonce,
	}}, nil
}

func (a *adminService) PolicyStatus(ctx context.Context, req *adminv1.PolicyStatusRequest) (*adminv1.PolicyStatusResponse, error) {
	st, err := a.s.cfg.Store.CountVerdictStatus(ctx)
	if err != nil {
		return nil, storeFailure("count the boot verdicts", err)
	}
	out := &adminv1.PolicyStatusResponse{}
	for _, c := range st {
		if req.Class != "" && c.Class != req.Class {
			continue
		}
		out.Classes = append(out.Classes, &adminv1.PolicyClassStatus{Class: c.Class, Nodes: uint32(c.Nodes), Current: uint32(c.Current),
			Next: uint32(c.Next), Both: uint32(c.Both), Failing: uint32(c.Failing), LatestUnixNano: c.Latest.UnixNano()})
	}
	return out, nil
}
