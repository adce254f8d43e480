package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/internal/fleetd/export"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// The export's paths on the HTTPS listener (docs/spire.md), each behind
// an admin client certificate.
const (
	ExportPath      = "/v1/export/registrations"
	ExportHoldsPath = "/v1/export/holds"
	ExportAllowPath = "/v1/export/allow"
	ExportRunsPath  = "/v1/export/runs"
	// ExportAllowedPath + "/" + digest answers {"allowed": bool} to a
	// credential that may apply the export (fleetd export spire asks it
	// before it changes anything).
	ExportAllowedPath = "/v1/export/allowed"
	// ExportDigestHeader carries the digest of the served export.
	ExportDigestHeader = "X-Nodetrust-Export-Digest"
)

// Bounds of the export endpoints.
const (
	maxExportHolds   = 100
	maxExportRunBody = 256 << 10
	maxAllowBody     = 4 << 10
)

// exportMetrics count the applier runs.
type exportMetrics struct {
	runs    *prometheus.CounterVec
	held    *prometheus.CounterVec
	changes *prometheus.CounterVec
}

func newExportMetrics(reg *prometheus.Registry) *exportMetrics {
	m := &exportMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_export_runs_total",
			Help: "SPIRE export applier runs by outcome (applied, unchanged, held, failed).",
		}, []string{"outcome"}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_export_held_total",
			Help: "SPIRE export runs a safeguard held back, by reason (empty, malformed, threshold).",
		}, []string{"reason"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_export_changes_total",
			Help: "SPIRE changes the export applier made (create, update, delete, ban) or held back (held_delete, held_ban).",
		}, []string{"kind"}),
	}
	reg.MustRegister(m.runs, m.held, m.changes)
	return m
}

// ExportDocument builds the registration export from the store: the
// envelope's JSON and its digest.
func (s *Server) ExportDocument(ctx context.Context) ([]byte, string, error) {
	nodes, err := s.cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("export: list nodes: %w", err)
	}
	return export.Build(nodes, export.Options{TrustDomain: s.cfg.Authority.TrustDomain, NodeCA: s.cfg.Authority.NodeCA, EligibleStates: s.cfg.ExportEligibleStates})
}

// ExportAllowed says whether the owner allowed the held change with this
// digest.
func (s *Server) ExportAllowed(ctx context.Context, digest string) (bool, error) {
	h, err := s.cfg.Store.GetExportHold(ctx, digest)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("export allowance of %s: %w", digest, err)
	}
	return !h.AllowedAt.IsZero(), nil
}

// RecordExportRun records what an applier run did and held back: in the
// metrics, the audit trail (actor names who ran it) and, for a change
// held over the threshold, the held changes the owner may allow.
func (s *Server) RecordExportRun(ctx context.Context, actor string, r export.Run) error {
	r = r.Bounded()
	m := s.exportMetrics
	m.runs.WithLabelValues(knownOutcome(r.Outcome)).Inc()
	if r.Outcome == export.OutcomeHeld {
		m.held.WithLabelValues(knownHeldReason(r.HeldReason)).Inc()
		m.changes.WithLabelValues("held_delete").Add(float64(r.Delete))
		m.changes.WithLabelValues("held_ban").Add(float64(r.Ban))
	} else {
		for kind, n := range map[string]int{"create": r.Create, "update": r.Update, "delete": r.Delete, "ban": r.Ban} {
			m.changes.WithLabelValues(kind).Add(float64(n))
		}
	}
	now := s.cfg.Now()
	if r.Outcome == export.OutcomeHeld && r.HeldReason == export.HeldThreshold && r.Digest != "" {
		err := s.cfg.Store.HoldExport(ctx, store.ExportHold{Digest: r.Digest, Nodes: len(r.Nodes), Withdrawals: r.Delete, Bans: r.Ban,
			Detail: r.Summary, LastHeld: now}, maxExportHolds)
		if err != nil {
			return fmt.Errorf("record the held export change: %w", err)
		}
	}
	detail := r.Outcome + ": " + r.Summary
	if r.Held != "" {
		detail += "; held: " + r.Held
	}
	if len(r.Errors) > 0 {
		detail += "; errors: " + strings.Join(r.Errors, "; ")
	}
	if len(detail) > 2048 {
		detail = detail[:2048] + "…"
	}
	if err := s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: now, Actor: actor, Action: "export.run", Subject: orDash(r.Digest), Detail: detail}); err != nil {
		return fmt.Errorf("audit the export run: %w", err)
	}
	level := s.log.InfoContext
	if r.Outcome == export.OutcomeHeld || r.Outcome == export.OutcomeFailed {
		level = s.log.WarnContext
	}
	level(ctx, "SPIRE export run", "outcome", r.Outcome, "digest", r.Digest, "held", r.Held, "summary", r.Summary, "errors", len(r.Errors), "by", actor)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func knownOutcome(o string) string {
	switch o {
	case export.OutcomeApplied, export.OutcomeUnchanged, export.OutcomeHeld, export.OutcomeFailed:
		return o
	}
	return "other"
}

func knownHeldReason(r string) string {
	switch r {
	case export.HeldEmpty, export.HeldMalformed, export.HeldThreshold:
		return r
	}
	return "other"
}

// AllowExport allows the held change with this digest (the owner's
// fleetd export allow), audited with the admin's name and reason.
func (s *Server) allowExport(ctx context.Context, admin, digest, reason string) (store.ExportHold, error) {
	reason, err := lifecycle.CheckReason(reason)
	if err != nil {
		return store.ExportHold{}, refused(codes.InvalidArgument, "%v", err)
	}
	now := s.cfg.Now()
	h, err := s.cfg.Store.AllowExport(ctx, digest, admin, now, &store.AuditEvent{Time: now, Actor: "admin:" + admin, Action: "export.allow", Subject: digest, Detail: reason})
	if errors.Is(err, store.ErrNotFound) {
		return store.ExportHold{}, refused(codes.NotFound, "no held export change has digest %s (see fleetd export held)", digest)
	}
	if err != nil {
		return store.ExportHold{}, storeFailure("allow export "+digest, err)
	}
	s.log.InfoContext(ctx, "held SPIRE export change allowed", logkey.Admin, admin, "digest", digest, logkey.Reason, reason)
	return h, nil
}

// ExportHoldJSON is a held change as the export endpoints serve it.
type ExportHoldJSON struct {
	Digest      string `json:"digest"`
	Nodes       int    `json:"nodes"`
	Withdrawals int    `json:"withdrawals"`
	Bans        int    `json:"bans"`
	Detail      string `json:"detail"`
	FirstHeld   int64  `json:"first_held_unix"`
	LastHeld    int64  `json:"last_held_unix"`
	AllowedAt   int64  `json:"allowed_unix,omitempty"`
	AllowedBy   string `json:"allowed_by,omitempty"`
}

func holdJSON(h store.ExportHold) ExportHoldJSON {
	return ExportHoldJSON{Digest: h.Digest, Nodes: h.Nodes, Withdrawals: h.Withdrawals, Bans: h.Bans, Detail: h.Detail,
		FirstHeld: unix(h.FirstHeld), LastHeld: unix(h.LastHeld), AllowedAt: unix(h.AllowedAt), AllowedBy: h.AllowedBy}
}

// ExportAllowRequest is the body of POST ExportAllowPath.
type ExportAllowRequest struct {
	Digest string `json:"digest"`
	Reason string `json:"reason"`
}

// exportRoutes adds the export endpoints to mux.
func (s *Server) exportRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET "+ExportPath, s.adminHTTP("ExportRegistrations", func(w http.ResponseWriter, r *http.Request, _ adminIdentity) error {
		body, digest, err := s.ExportDocument(r.Context())
		if err != nil {
			return unavailable("export", "the export could not be built; retry, and see the server log", err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set(ExportDigestHeader, digest)
		_, _ = w.Write(body)
		return nil
	}))
	mux.HandleFunc("GET "+ExportHoldsPath, s.adminHTTP("ExportHolds", func(w http.ResponseWriter, r *http.Request, _ adminIdentity) error {
		hs, err := s.cfg.Store.ListExportHolds(r.Context(), maxExportHolds)
		if err != nil {
			return storeFailure("list held export changes", err)
		}
		out := make([]ExportHoldJSON, 0, len(hs))
		for _, h := range hs {
			out = append(out, holdJSON(h))
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}))
	mux.HandleFunc("GET "+ExportHoldsPath+"/{digest}", s.adminHTTP("ExportHolds", func(w http.ResponseWriter, r *http.Request, _ adminIdentity) error {
		h, err := s.cfg.Store.GetExportHold(r.Context(), r.PathValue("digest"))
		if err != nil {
			return storeFailure("held export change "+r.PathValue("digest"), err)
		}
		writeJSON(w, http.StatusOK, holdJSON(h))
		return nil
	}))
	mux.HandleFunc("GET "+ExportAllowedPath+"/{digest}", s.adminHTTP("ExportAllowed", func(w http.ResponseWriter, r *http.Request, _ adminIdentity) error {
		allowed, err := s.ExportAllowed(r.Context(), r.PathValue("digest"))
		if err != nil {
			return storeFailure("export allowance", err)
		}
		writeJSON(w, http.StatusOK, map[string]bool{"allowed": allowed})
		return nil
	}))
	mux.HandleFunc("POST "+ExportAllowPath, s.adminHTTP("ExportAllow", func(w http.ResponseWriter, r *http.Request, id adminIdentity) error {
		var req ExportAllowRequest
		if err := readJSON(r, maxAllowBody, &req); err != nil {
			return refused(codes.InvalidArgument, "%v", err)
		}
		h, err := s.allowExport(r.Context(), id.name, req.Digest, req.Reason)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, holdJSON(h))
		return nil
	}))
	mux.HandleFunc("POST "+ExportRunsPath, s.adminHTTP("ExportRun", func(w http.ResponseWriter, r *http.Request, id adminIdentity) error {
		var run export.Run
		if err := readJSON(r, maxExportRunBody, &run); err != nil {
			return refused(codes.InvalidArgument, "%v", err)
		}
		if err := s.RecordExportRun(r.Context(), "admin:"+id.name, run); err != nil {
			return unavailable("export run", "the run could not be recorded; retry, and see the server log", err)
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}))
}

// adminHTTP makes an export endpoint of h: the request is authenticated by
// its admin client certificate and admitted as an Admin call of method
// (admitAdmin: the role rule in adminActions, refusals audited, logged and
// counted); h's outcome is then audited and counted like any Admin call's,
// and a failure answered by httpFailure.
func (s *Server) adminHTTP(method string, h func(http.ResponseWriter, *http.Request, adminIdentity) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		none := refused(codes.Unauthenticated, "the export endpoints need an admin client certificate (admin/owner.crt from fleetd init, or a credential from fleetd admin create)")
		if r.TLS == nil {
			s.httpFailure(w, r, none)
			return
		}
		id, err := s.adminFromChains(r.Context(), r.TLS.VerifiedChains, none)
		if err != nil {
			s.httpFailure(w, r, err)
			return
		}
		ctx, finish, err := s.admitAdmin(r.Context(), id, method, nil)
		if err != nil {
			s.httpFailure(w, r, err)
			return
		}
		err = h(w, r.WithContext(ctx), id)
		finish(err)
		if err != nil {
			s.httpFailure(w, r, err)
		}
	}
}

// httpFailure answers an export request's failure: the status its code
// maps to and {"error": message}; an internal cause goes to the log only.
func (s *Server) httpFailure(w http.ResponseWriter, r *http.Request, err error) {
	var ce *callError
	if !errors.As(err, &ce) {
		ce = unavailable("export", "the request failed; retry, and see the server log", err)
	}
	if ce.cause != nil {
		s.log.ErrorContext(r.Context(), ce.op+" failed", append([]any{logkey.Error, ce.cause}, ce.attrs...)...)
	}
	status := http.StatusInternalServerError
	switch ce.code {
	case codes.Unauthenticated:
		status = http.StatusUnauthorized
	case codes.PermissionDenied:
		status = http.StatusForbidden
	case codes.InvalidArgument:
		status = http.StatusBadRequest
	case codes.NotFound:
		status = http.StatusNotFound
	case codes.Unavailable:
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, map[string]string{"error": ce.msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// readJSON decodes a request body of at most limit bytes.
func readJSON(r *http.Request, limit int64, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return fmt.Errorf("read the request: %w", err)
	}
	if int64(len(body)) > limit {
		return fmt.Errorf("the request is larger than %d bytes", limit)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the request is not the expected JSON: %w", err)
	}
	return nil
}
