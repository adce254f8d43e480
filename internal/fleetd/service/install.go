package service

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/admit"
	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/tinkerbell"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/confirm"
	"github.com/nodetrust/nodetrust/pki/netreport"
)

// The rules of an install refusal that come before the admission rules
// (admit.Rule*): they check the request itself.
const (
	// RuleSession: the intake session is unknown or has ended.
	RuleSession admit.Rule = "intake-session"
	// RuleLDevID: the LDevID chain is not the one the session issued.
	RuleLDevID admit.Rule = "ldevid"
	// RuleConfirmation: the confirmation is not the device key's, or is
	// too old or dated in the future.
	RuleConfirmation admit.Rule = "confirmation"
	// RuleRender: the machine's config could not be rendered; no code was
	// issued.
	RuleRender admit.Rule = "render"
	// RuleReleased: this machine's config was already fetched with its
	// install code; a second install would replace that release and lose
	// its pending activation.
	RuleReleased admit.Rule = "released"
	// RuleNotConfigured: this fleetd has no [render.CLASS], so it installs
	// nothing.
	RuleNotConfigured admit.Rule = "not-configured"
)

// Defaults of InstallSettings.
const (
	// DefaultCredentialLifetime is how long the join credential of a
	// render lasts: longer than the release's TTL (install.DefaultTTL), so
	// a config fetched late still carries a credential that works.
	DefaultCredentialLifetime = 8 * time.Hour
	// confirmMaxAge bounds how old a confirmation may be when it arrives.
	confirmMaxAge = 5 * time.Minute
	// maxInstallChain bounds the LDevID chain's certificates.
	maxInstallChain = 4
	// installActor is the actor of what an install writes (the join
	// token, the audit).
	installActor = "install"
)

// CodeIssuer issues an install code for a rendered config, wrapped to a
// TPM (install.Releaser).
type CodeIssuer interface {
	IssueWrapped(ctx context.Context, rd install.Render, ekPublicArea, akName []byte) (install.Wrapped, install.Issued, error)
}

// Renderer renders a node's machine config by its class (render.Registry).
type Renderer interface {
	Render(in render.Input) (render.Config, error)
}

// Provisioner writes the provisioning objects of an installed machine
// (tinkerbell.Provisioner.Apply): its Hardware, the Template that runs the
// provision script and the Workflow the install environment's agent runs
// in the machine's current boot. It creates or updates: a machine that
// installs again gets its objects updated, not duplicated. It never powers
// the machine: it is in the install environment, and a power cycle would
// end the boot its pass marker names.
type Provisioner interface {
	Apply(ctx context.Context, d store.Declaration) (tinkerbell.Objects, error)
}

// BootstrapTokens issue a worker's own Kubernetes bootstrap token for its
// render (kube.TokenIssuer): id names it in logs and the audit, bearer
// ("<id>.<secret>") is for the render alone.
type BootstrapTokens interface {
	IssueBootstrapToken(ctx context.Context, node string, now time.Time) (id, bearer string, expires time.Time, err error)
}

// InstallSettings wire the Install RPC: without them (SetInstall never
// called) every install is refused as not configured.
type InstallSettings struct {
	Releaser  CodeIssuer
	Renderers Renderer
	// Fleetd is how an installed machine reaches the control plane, for
	// the render.
	Fleetd render.Fleetd
	// ReportMaxAge and ReportMaxSkew bound the network report's
	// observed_at (admit.DefaultMaxReportAge, admit.DefaultMaxSkew when
	// zero); the skew bounds the confirmation's time too.
	ReportMaxAge  time.Duration
	ReportMaxSkew time.Duration
	// CredentialLifetime is how long the join credential a render
	// carries is accepted (DefaultCredentialLifetime when zero).
	CredentialLifetime time.Duration
	// ControlPlaneRoles are the declared roles any renderer renders as a
	// control plane (default {"control-plane"}): admission treats them
	// as control planes, never auto-provisioned.
	ControlPlaneRoles []string
	// Provisioner, when set, writes the provisioning objects of each
	// issued install ([tinkerbell] in fleetd.toml); nil writes none, and
	// the operator starts the provision by other means.
	Provisioner Provisioner
	// KubeTokens, when set ([kubernetes]), issue the bootstrap token of
	// each node of a class other than the control-plane classes, which
	// its render carries; a failure refuses the install before any code
	// is issued.
	KubeTokens BootstrapTokens
}

// installState holds the settings SetInstall gave.
type installState struct {
	p atomic.Pointer[InstallSettings]
}

// SetInstall wires the Install RPC to the config release and the
// renderers, which fleetd builds after the Server (the releaser counts in
// the Server's metrics registry). Call it before serving.
func (s *Server) SetInstall(in InstallSettings) {
	if in.CredentialLifetime <= 0 {
		in.CredentialLifetime = DefaultCredentialLifetime
	}
	s.install.p.Store(&in)
}

// Install decides a request for installation (docs/install.md,
// "Admission"): the intake session, the LDevID, the confirmation, the
// admission rules (admit.Admitter.Decide), then the provision, the join
// credential, the render and the install code wrapped to the session's
// TPM. A refusal is PERMISSION_DENIED with admit.Refusal.Wire and the
// request id; its rule and field are logged and audited on the server.
func (j *joinService) Install(ctx context.Context, req *joinv1.InstallRequest) (*joinv1.InstallResponse, error) {
	s := j.s
	reqID := newRequestID()
	resp, err := j.install(ctx, req, reqID)
	if err == nil {
		s.metrics.installs.WithLabelValues("issued").Inc()
		return resp, nil
	}
	var rf *admit.Refusal
	if !errors.As(err, &rf) {
		s.metrics.installs.WithLabelValues("failed").Inc()
		if errors.Is(err, pki.ErrKeyUnavailable) {
			return nil, signFailure("install (request "+reqID+")", err, logkey.RequestID, reqID)
		}
		return nil, unavailable("install", "install could not be completed; retry later (request "+reqID+")", err, logkey.RequestID, reqID)
	}
	s.metrics.installs.WithLabelValues("refused_" + string(rf.Rule)).Inc()
	s.logRefusal(ctx, "install."+string(rf.Rule), peerSource(ctx), "install refused", logkey.RequestID, reqID,
		"rule", string(rf.Rule), "field", rf.Field, logkey.NodeID, rf.Device, logkey.Reason, rf.Reason, logkey.Peer, peerAddr(ctx))
	if rf.Device != "" {
		if ok, _ := s.auditThrottle.Allow("install."+string(rf.Rule), rf.Device); ok {
			detail := string(rf.Rule)
			if rf.Field != "" {
				detail += " (field " + rf.Field + ")"
			}
			_ = s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: s.cfg.Now(), Actor: installActor, Action: "install.refused",
				Subject: rf.Device, Detail: capDetail(detail + ": " + rf.Reason)})
		} else {
			s.metrics.auditDropped.Inc()
		}
	}
	code := codes.PermissionDenied
	if errors.Is(rf.Err, lifecycle.ErrSourceUnavailable) {
		code = codes.Unavailable
	}
	return nil, refused(code, "%s (request %s)", rf.Wire(), reqID)
}

// installRefusal is a refusal of rule before or after the admission rules.
func installRefusal(rule admit.Rule, device, do, format string, args ...any) *admit.Refusal {
	return &admit.Refusal{Rule: rule, Device: device, Do: do, Reason: fmt.Sprintf(format, args...)}
}

func (j *joinService) install(ctx context.Context, req *joinv1.InstallRequest, reqID string) (*joinv1.InstallResponse, error) {
	s := j.s
	set := s.install.p.Load()
	if set == nil || set.Releaser == nil || set.Renderers == nil {
		return nil, installRefusal(RuleNotConfigured, "", "this control plane does not install machines: its operator configures [render.CLASS] in fleetd.toml",
			"the Install RPC is not wired (no releaser or renderers)")
	}
	if len(req.SessionId) == 0 || len(req.SessionId) > confirm.MaxSessionID {
		return nil, installRefusal(RuleSession, "", "send the session id of intake.json: run bcd intake again, then bcd install",
			"session id missing or longer than %d bytes", confirm.MaxSessionID)
	}
	sess, err := s.IntakeSession(ctx, req.SessionId)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, installRefusal(RuleSession, "", "this intake session is unknown: run bcd intake again, then bcd install", "%v", err)
	case errors.Is(err, ErrIntakeSessionEnded):
		// Stale: the session's device is named on the server only.
		rf := installRefusal(RuleSession, "", "the intake session has ended (stale session): run bcd intake again, then bcd install", "%v", err)
		if got, gerr := s.cfg.Store.GetIntakeSession(ctx, req.SessionId); gerr == nil {
			rf.Device = got.Device
		}
		return nil, rf
	case err != nil:
		return nil, err
	}
	name := sess.Device
	devKey, err := s.checkLDevID(req.LdevidChain, sess)
	if err != nil {
		return nil, installRefusal(RuleLDevID, name, "send the LDevID of this intake (ldevid.crt): run bcd intake again, then bcd install", "%v", err)
	}
	now := s.cfg.Now()
	var rep *netreport.Signed
	if len(req.NetworkReport) > 0 {
		r, err := netreport.Unmarshal(req.NetworkReport)
		if err != nil {
			return nil, &admit.Refusal{Rule: admit.RuleReportSignature, Device: name, Reason: err.Error(),
				Do: "the network report is malformed: run the released bcd install again"}
		}
		rep = &r
	}
	// The confirmation binds the report sent (or none) to the session.
	digest := make([]byte, 32)
	if rep != nil {
		digest = netreport.Digest(rep.Report)
	}
	c := confirm.Confirmation{SessionID: req.SessionId, ReportDigest: digest, At: time.Unix(0, req.ConfirmedAtUnixNano)}
	if err := confirm.Verify(c, devKey, req.ConfirmationSignature); err != nil {
		return nil, installRefusal(RuleConfirmation, name, "the confirmation is not signed by this intake's device key: run bcd intake again, then bcd install", "%v", err)
	}
	skew := set.ReportMaxSkew
	if skew <= 0 {
		skew = admit.DefaultMaxSkew
	}
	if age := now.Sub(c.At); age > confirmMaxAge || -age > skew {
		return nil, installRefusal(RuleConfirmation, name, "the confirmation is too old or dated in the future: check the machine's clock, then run bcd install again",
			"the confirmation was signed at %s, now %s (at most %s old, %s ahead)", c.At.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), confirmMaxAge, skew)
	}

	ad := admit.Admitter{Source: s.cfg.Inventory, Nodes: s.cfg.Store, MaxReportAge: set.ReportMaxAge, MaxSkew: set.ReportMaxSkew, AutoProvision: s.cfg.AutoProvision,
		ControlPlaneClasses: s.cfg.ControlPlaneClasses, ControlPlaneRoles: set.ControlPlaneRoles}
	dec, err := ad.Decide(ctx, admit.Request{Device: name, EKPin: sess.EKPin, DeviceKey: devKey, Report: rep, Now: now})
	if err != nil {
		return nil, err
	}
	d := dec.Decl
	if d.ProductUUID == "" {
		return nil, &admit.Refusal{Rule: admit.RuleComplete, Field: "product_uuid", Device: name, Reason: "the declaration has no product UUID, by which the config is fetched",
			Do: "the declaration of this machine lacks product_uuid: complete it in the inventory and apply it"}
	}
	if uuid, err := install.NormalizeUUID(d.ProductUUID); err == nil {
		prev, err := s.cfg.Store.GetConfigRelease(ctx, uuid)
		switch {
		case err == nil && prev.State == store.ReleaseBurned:
			return nil, installRefusal(RuleReleased, name, "this machine's config was already released: it installs once; if that install failed, its owner retires it and declares it again",
				"the config of %s (generation %d) was released at %s; activation %q", uuid, prev.Generation, prev.BurnedAt.UTC().Format(time.RFC3339), prev.Activation)
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return nil, fmt.Errorf("read the config release of %s: %w", name, err)
		}
	}
	if p := dec.Provision; p != nil {
		if _, err := s.lifecycle.Do(ctx, lifecycle.Provision, p.NodeID, p.Actor, p.Reason, reqID); err != nil {
			return nil, fmt.Errorf("write the provision of %s: %w", name, err)
		}
	}

	// The per-node join credential: stored (hashed) only once the render
	// succeeded, so a refused render leaves no credential behind.
	secret, hash, tokenID, err := NewToken()
	if err != nil {
		return nil, err
	}
	expires := now.Add(set.CredentialLifetime)
	node := render.FromDeclaration(d)
	in := render.Input{Node: node, Credential: secret, CredentialExpires: expires, Fleetd: set.Fleetd}
	kubeToken := "none"
	if set.KubeTokens != nil && !s.isControlPlane(classOf(d.Class)) {
		// The worker's own bootstrap token, before the render that carries
		// it: without it no code is issued. A render refused after it
		// leaves the token to expire (it joins only this node, once).
		id, bearer, until, err := set.KubeTokens.IssueBootstrapToken(ctx, name, now)
		if err != nil {
			return nil, fmt.Errorf("issue the Kubernetes bootstrap token of %s: %w", name, err)
		}
		in.KubeBootstrapToken = bearer
		kubeToken = id + " until " + until.UTC().Format(time.RFC3339)
	}
	cfg, err := set.Renderers.Render(in)
	if err != nil {
		return nil, installRefusal(RuleRender, name, "this machine's config cannot be rendered: its operator fixes the declaration or fleetd's [render] settings (see fleetd's log), then run bcd install again",
			"%v", err)
	}
	tok := store.Token{ID: tokenID, Hash: hash, Role: node.Role, Site: d.Site, NodeID: name, CreatedBy: installActor, CreatedAt: now, ExpiresAt: expires}
	if err := s.cfg.Store.CreateToken(ctx, tok); err != nil {
		return nil, fmt.Errorf("store the join credential of %s: %w", name, err)
	}
	w, iss, err := set.Releaser.IssueWrapped(ctx, install.Render{UUID: d.ProductUUID, NodeID: name, Config: cfg.Data, ContentType: cfg.ContentType, Actor: installActor},
		sess.EKPublic, sess.AKName)
	if err != nil {
		return nil, fmt.Errorf("issue the install code of %s: %w", name, err)
	}
	verdict := intakeVerdict(sess)
	// The provisioning objects, once the code exists: their action waits
	// for the code the machine unwraps from this response. A failure fails
	// the install (UNAVAILABLE); the machine's retry renders anew, which
	// invalidates this code.
	objects := "no provisioning objects (not configured)"
	if set.Provisioner != nil {
		o, err := set.Provisioner.Apply(ctx, d)
		if err != nil {
			return nil, fmt.Errorf("write the provisioning objects of %s: %w", name, err)
		}
		objects = fmt.Sprintf("Tinkerbell Hardware, Template and Workflow %s/%s", o.Namespace, o.Workflow)
		if o.WorkflowReplaced {
			objects += " (a finished Workflow replaced)"
		}
	}
	detail := fmt.Sprintf("session %s, EK %s, AK %s; %s; report chassis %q port %q; join token %s until %s; Kubernetes bootstrap token %s; release generation %d until %s; boot verdict %s; %s",
		sess.ID, sess.EKPin, hex.EncodeToString(sess.AKName), dec.Authority, dec.Report.ChassisID, dec.Report.PortID, tokenID,
		expires.UTC().Format(time.RFC3339), kubeToken, iss.Generation, iss.ExpiresAt.UTC().Format(time.RFC3339), verdict, objects)
	if err := s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: now, Actor: installActor, Action: "install", Subject: name, Detail: capDetail(detail)}); err != nil {
		return nil, fmt.Errorf("audit the install of %s: %w", name, err)
	}
	s.log.InfoContext(ctx, "install code issued", logkey.NodeID, name, "session", sess.ID, logkey.TokenID, tokenID,
		"generation", iss.Generation, "authority", dec.Authority, "boot_verdict", verdict, "kube_bootstrap_token", kubeToken, "provisioning", objects, logkey.RequestID, reqID, logkey.Peer, peerAddr(ctx))
	return &joinv1.InstallResponse{
		CredentialBlob: w.CredentialBlob, EncryptedSecret: w.EncryptedSecret,
		Device: name, ProductUuid: d.ProductUUID, ExpiresAtUnixNano: iss.ExpiresAt.UnixNano(), BootVerdict: verdict,
	}, nil
}

// checkLDevID checks that chain's leaf is the LDevID the session issued —
// it chains to the DevID CA, is valid now, is an LDevID naming the
// session's device, and has the session's serial — and returns its key.
func (s *Server) checkLDevID(chain [][]byte, sess store.IntakeSession) (crypto.PublicKey, error) {
	iss := s.cfg.Authority.DevIDIssuer
	if iss == nil {
		return nil, errors.New("the PKI has no DevID CA")
	}
	if len(chain) == 0 || len(chain) > maxInstallChain {
		return nil, fmt.Errorf("the LDevID chain has %d certificates, want 1 to %d", len(chain), maxInstallChain)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, fmt.Errorf("the LDevID: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(s.cfg.Authority.Root)
	inter := x509.NewCertPool()
	for _, c := range iss.Chain() {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: s.cfg.Now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("the LDevID does not chain to the DevID CA: %w", err)
	}
	// The node CA chains to the same root: the leaf must be the DevID
	// CA's own.
	if err := leaf.CheckSignatureFrom(iss.CA()); err != nil {
		return nil, fmt.Errorf("the LDevID is not issued by the DevID CA: %w", err)
	}
	info, err := pki.ParseDeviceCert(leaf)
	if err != nil {
		return nil, err
	}
	switch {
	case info.Kind != pki.LDevID:
		return nil, fmt.Errorf("the certificate is a %s certificate, not an LDevID", info.Kind)
	case info.Device != sess.Device:
		return nil, fmt.Errorf("the LDevID names %.80q, the session %s", info.Device, sess.Device)
	case leaf.SerialNumber.String() != sess.LDevIDSerial:
		return nil, fmt.Errorf("the LDevID's serial %s is not the session's (%s)", leaf.SerialNumber, sess.LDevIDSerial)
	}
	return leaf.PublicKey, nil
}

// intakeVerdict is the verdict on the boot the session's intake quoted,
// kept with the session ("none" without a boot policy): the node writes
// its pass marker only on "pass", and only in that same boot.
func intakeVerdict(sess store.IntakeSession) string {
	if sess.BootVerdict == "" {
		return store.IntakeBootNone
	}
	return sess.BootVerdict
}
