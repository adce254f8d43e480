package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodetrust/nodetrust/internal/fleetd/actuator"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// DefaultClass is the class of a node no declaration classes.
const DefaultClass = "worker"

// DefaultVerdictsKept is how many verdicts the store keeps per node.
const DefaultVerdictsKept = 50

// Reasons boot evidence is not evidence (nodetrust_boot_evidence_ignored_total):
// nothing about the machine is proven, so no state changes.
const (
	ignoredUnknownNonce = "unknown_nonce"
	ignoredExpired      = "nonce_expired"
	ignoredTimeout      = "timeout"
	ignoredSessionEnded = "session_ended"
	ignoredNodeError    = "node_error"
	ignoredNoAK         = "no_ak"
	ignoredWrongAK      = "wrong_ak"
	ignoredNotLAK       = "not_lak"
	ignoredUnproven     = "unproven"
	ignoredIncomplete   = "incomplete"
	ignoredUnknownClass = "unknown_class"
	ignoredStore        = "not_stored"
)

// What fleetd did about a verdict.
const (
	actionNone        = "none"
	actionQuarantined = "quarantined"
	actionAlready     = "already quarantined"
	actionAlerted     = "alerted"
	actionFailed      = "quarantine failed"
	// actionAudited: the class's policy is in audit mode; the failure
	// alerts and nothing is enforced.
	actionAudited = "audited"
	// actionWarned: fewer failed verdicts in a row than the policy's
	// [response] quarantine_after, and no critical rule failed.
	actionWarned = "warned"
)

// bootMetrics count boot evidence and what came of it.
type bootMetrics struct {
	verdicts   *prometheus.CounterVec
	ignored    *prometheus.CounterVec
	alerts     *prometheus.CounterVec
	actuations *prometheus.CounterVec
	audited    *prometheus.CounterVec
	warnings   *prometheus.CounterVec
	mode       *prometheus.GaugeVec
	stale      prometheus.Gauge
	idle       prometheus.Gauge
}

func newBootMetrics(reg *prometheus.Registry) *bootMetrics {
	m := &bootMetrics{
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_boot_verdicts_total",
			Help: "Boot-policy verdicts of TPM-proven evidence, by stage (intake, renewal, boot-check) and result (pass, fail).",
		}, []string{"stage", "result"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_boot_evidence_ignored_total",
			Help: "Boot evidence that proved nothing and changed nothing, by reason (timeout, session_ended, unproven, unknown_nonce, …).",
		}, []string{"reason"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_boot_alerts_total",
			Help: "Failed boot verdicts of control-plane classes: alerts, no quarantine, by class.",
		}, []string{"class"}),
		actuations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_actuator_requests_total",
			Help: "Cordons requested of the actuator after a quarantine, by actuator and outcome (ok, failed).",
		}, []string{"actuator", "outcome"}),
		audited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_boot_audit_failures_total",
			Help: "Failed boot verdicts of classes whose policy is in audit mode: alerts, nothing enforced, by class.",
		}, []string{"class"}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_boot_warnings_total",
			Help: "Failed boot verdicts below the policy's [response] quarantine_after in a row: warnings, state unchanged, by class.",
		}, []string{"class"}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodetrust_boot_policy_mode",
			Help: "1 for the mode (enforce, audit) each class's boot policy is in.",
		}, []string{"class", "mode"}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodetrust_boot_stale_nodes",
			Help: "Nodes with a live TPM identity whose last boot verdict is older than [boot_policy] stale_after (at the last sweep).",
		}),
		idle: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodetrust_boot_verifier_idle",
			Help: "1 when no boot verdict was stored for [boot_policy] stale_after while nodes with a live TPM identity exist.",
		}),
	}
	reg.MustRegister(m.verdicts, m.ignored, m.alerts, m.actuations, m.audited, m.warnings, m.mode, m.stale, m.idle)
	return m
}

func (m *bootMetrics) ignore(reason string) { m.ignored.WithLabelValues(reason).Inc() }

// notEvidence is boot evidence that proves nothing: counted by reason, it
// changes no state.
type notEvidence struct {
	reason string
	err    error
}

func (e *notEvidence) Error() string { return "not evidence (" + e.reason + "): " + e.err.Error() }
func (e *notEvidence) Unwrap() error { return e.err }

// classOf is the boot-policy class of a node.
func classOf(class string) string {
	if class == "" {
		return DefaultClass
	}
	return class
}

// isControlPlane reports whether a failed verdict of class only alerts.
func (s *Server) isControlPlane(class string) bool {
	for _, c := range s.cfg.ControlPlaneClasses {
		if c == class {
			return true
		}
	}
	return false
}

// judgeBoot evaluates TPM-proven evidence of nodeID (empty for a machine
// without a node id yet) against class's policy at stage, and stores the
// verdict — in the store when there is a node id, and in verdicts.jsonl —
// before it returns it: a caller acts only on a stored verdict. Evidence
// the TPM does not prove, or that cannot be judged, is a *notEvidence,
// counted here.
func (s *Server) judgeBoot(ctx context.Context, nodeID, class string, stage bootpolicy.Stage, ev bootpolicy.Evidence) (*bootpolicy.Verdict, error) {
	v, err := s.cfg.BootPolicy.Evaluate(class, stage, ev)
	if err != nil {
		reason := ignoredIncomplete
		switch {
		case errors.Is(err, bootpolicy.ErrUnproven):
			reason = ignoredUnproven
		case errors.Is(err, bootpolicy.ErrUnknownClass):
			reason = ignoredUnknownClass
		}
		s.boot.ignore(reason)
		return nil, &notEvidence{reason: reason, err: err}
	}
	v.NodeID = nodeID
	if err := s.storeVerdict(ctx, v, ev); err != nil {
		s.boot.ignore(ignoredStore)
		return nil, err
	}
	s.boot.verdicts.WithLabelValues(string(stage), v.Result).Inc()
	if v.Pass() {
		s.log.InfoContext(ctx, "boot verdict", logkey.NodeID, nodeID, "class", class, "stage", string(stage), "result", v.Result)
	} else {
		s.log.WarnContext(ctx, "boot verdict", logkey.NodeID, nodeID, "class", class, "stage", string(stage), "result", v.Result,
			"failed", strings.Join(v.Failed, ","), logkey.Reason, failedSummary(v))
	}
	return v, nil
}

// storeVerdict writes v to the store (with a node id) and to the verdict
// log (when one is open).
func (s *Server) storeVerdict(ctx context.Context, v *bootpolicy.Verdict, ev bootpolicy.Evidence) error {
	if v.NodeID != "" {
		sv := storedVerdict(v)
		if ev.Quote != nil {
			sv.NonceSHA256, sv.QuoteSHA256 = sha256Hex(ev.Quote.Nonce), sha256Hex(ev.Quote.Attest)
		}
		if err := s.cfg.Store.AppendVerdict(ctx, sv, s.cfg.VerdictsKept); err != nil {
			return fmt.Errorf("store the boot verdict of node %s: %w", v.NodeID, err)
		}
	}
	if s.cfg.VerdictLog != nil {
		if err := s.cfg.VerdictLog.Append(v); err != nil {
			return fmt.Errorf("append the boot verdict to %s: %w", bootpolicy.VerdictLogName, err)
		}
	}
	return nil
}

// keepEvidence keeps ev, the evidence of the stored verdict v, as node
// nodeID's latest boot evidence, from which fleetd policy capture --node
// writes a policy. Only evidence a TPM proved is kept (ev has a verified
// quote: the verdict was made). A log over the bound is not kept, and a
// store failure only logged: the verdict, stored and acted on, stands
// either way.
func (s *Server) keepEvidence(ctx context.Context, nodeID string, v *bootpolicy.Verdict, ev bootpolicy.Evidence) {
	if ev.Quote == nil {
		return
	}
	if len(ev.EventLog) > store.MaxEvidenceLogSize {
		s.log.InfoContext(ctx, "boot evidence not kept for policy capture: its event log is over the limit", logkey.NodeID, nodeID,
			"bytes", len(ev.EventLog), "limit", store.MaxEvidenceLogSize)
		return
	}
	e := store.BootEvidence{
		NodeID: nodeID, Time: v.Time, Stage: string(v.Stage), Class: v.Class, Passed: v.Pass(),
		PCRs: ev.PCRs, EventLog: ev.EventLog,
		AKPublic: ev.Quote.AKPublic, QuoteAttest: ev.Quote.Attest, QuoteSignature: ev.Quote.Signature, Nonce: ev.Quote.Nonce,
	}
	if err := s.cfg.Store.PutBootEvidence(ctx, e); err != nil {
		s.log.ErrorContext(ctx, "boot evidence not kept for policy capture (the verdict stands): fleetd policy capture --node takes the evidence kept before",
			logkey.NodeID, nodeID, logkey.Error, err)
	}
}

// storedVerdict is v as the store keeps it, without the evidence's
// digests.
func storedVerdict(v *bootpolicy.Verdict) store.Verdict {
	return store.Verdict{NodeID: v.NodeID, Time: v.Time, Stage: string(v.Stage), Class: v.Class, Passed: v.Pass(), Matched: v.Matched,
		Policy: v.Policy, Failed: failedRules(v)}
}

func failedRules(v *bootpolicy.Verdict) []store.FailedRule {
	var out []store.FailedRule
	for _, r := range v.Rules {
		if !r.Pass {
			out = append(out, store.FailedRule{Rule: r.Rule, Reason: r.Detail})
		}
	}
	return out
}

// failedSummary is every failed rule with its reason, on one line.
func failedSummary(v *bootpolicy.Verdict) string {
	var parts []string
	for _, r := range failedRules(v) {
		parts = append(parts, r.Rule+": "+r.Reason)
	}
	return strings.Join(parts, "; ")
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// actOnFailure acts on a stored, failed verdict of a running node (seed
// 003, "Runtime identity and withdrawal"): a control-plane class raises an
// alert (log line and metric) and changes nothing; any other class is
// quarantined — renewal refused until fleetd nodes release — and a cordon
// is requested of the actuator.
func (s *Server) actOnFailure(ctx context.Context, n store.Node, v *bootpolicy.Verdict) string {
	ctx = context.WithoutCancel(ctx)
	class := classOf(n.Class)
	summary := failedSummary(v)
	// The verdict was made by class's policy, so it exists.
	p, _ := s.cfg.BootPolicy.Policy(class)
	if p != nil && !p.Enforced() {
		s.auditAlert(ctx, n.ID, class, v)
		return actionAudited
	}
	if s.isControlPlane(class) {
		s.boot.alerts.WithLabelValues(class).Inc()
		s.log.ErrorContext(ctx, "ALERT: a control-plane machine failed its boot policy; no automatic quarantine: review it and quarantine or retire it by hand",
			logkey.NodeID, n.ID, "class", class, "stage", string(v.Stage), logkey.Reason, summary)
		return actionAlerted
	}
	if p != nil {
		if warn, failures := s.belowQuarantine(ctx, n.ID, p, v); warn {
			s.boot.warnings.WithLabelValues(class).Inc()
			s.log.WarnContext(ctx, "boot verdict failed: a warning, no quarantine yet",
				logkey.NodeID, n.ID, "class", class, "stage", string(v.Stage), "failures_in_a_row", failures, "quarantine_after", p.QuarantineAfter, logkey.Reason, summary)
			return actionWarned
		}
	}
	reqID := newRequestID()
	reason := capClaim("boot check failed (" + string(v.Stage) + "): " + summary)
	res, err := s.lifecycle.Quarantine(ctx, n.ID, "bootpolicy", reason, reqID)
	var se *lifecycle.StateError
	switch {
	case errors.As(err, &se) && se.State == store.StateQuarantined:
		return actionAlready
	case err != nil:
		s.log.ErrorContext(ctx, "quarantine after a failed boot verdict failed: quarantine the node by hand (fleetd nodes quarantine)",
			logkey.NodeID, n.ID, logkey.Error, err)
		return actionFailed
	}
	s.metrics.transition(lifecycle.Quarantine.Name)
	s.log.WarnContext(ctx, "node quarantined by its boot policy", logkey.NodeID, n.ID, "class", class, logkey.Reason, summary, logkey.RequestID, reqID)
	if s.cfg.Actuator != nil {
		a := s.cfg.Actuator
		err := a.Cordon(ctx, actuator.Cordon{NodeID: n.ID, SPIFFEID: res.Node.SPIFFEID, Class: class, Reason: reason, Time: s.cfg.Now().UTC(), RequestID: reqID})
		if err != nil {
			s.boot.actuations.WithLabelValues(a.Name(), "failed").Inc()
			s.log.ErrorContext(ctx, "cordon request failed: the node is quarantined, but cordon it by hand", logkey.NodeID, n.ID, "actuator", a.Name(), logkey.Error, err)
		} else {
			s.boot.actuations.WithLabelValues(a.Name(), "ok").Inc()
		}
	}
	return actionQuarantined
}

// auditAlert raises the alert of a failed verdict under a policy in audit
// mode: a log line and a metric, nothing enforced.
func (s *Server) auditAlert(ctx context.Context, nodeID, class string, v *bootpolicy.Verdict) {
	s.boot.audited.WithLabelValues(class).Inc()
	s.log.ErrorContext(ctx, "ALERT: a boot failed its policy in audit mode; nothing enforced: fix the machine or the policy before setting mode = \"enforce\"",
		logkey.NodeID, nodeID, "class", class, "stage", string(v.Stage), logkey.Reason, failedSummary(v))
}

// belowQuarantine reports whether the failed, stored verdict v of node
// nodeID only warns under p's graded response: no critical rule failed,
// and fewer than p.QuarantineAfter verdicts in a row failed (counted from
// the store's history, v included, so the count holds across restarts and
// replicas). It returns the count. When the history cannot be read, the
// failure quarantines as without a graded response.
func (s *Server) belowQuarantine(ctx context.Context, nodeID string, p *bootpolicy.Policy, v *bootpolicy.Verdict) (bool, int) {
	for _, r := range v.Failed {
		if p.IsCritical(r) {
			return false, 0
		}
	}
	if p.QuarantineAfter <= 1 {
		return false, 1
	}
	vs, err := s.cfg.Store.ListVerdicts(ctx, nodeID, p.QuarantineAfter)
	if err != nil {
		s.log.ErrorContext(ctx, "the verdict history could not be read: the failure is acted on as if quarantine_after were 1", logkey.NodeID, nodeID, logkey.Error, err)
		return false, 0
	}
	failures := 0
	for _, sv := range vs {
		if sv.Passed {
			break
		}
		failures++
	}
	return failures < p.QuarantineAfter, failures
}

// announceModes says, per class, which mode its policy is in: a log line
// at start and the gauge nodetrust_boot_policy_mode.
func (s *Server) announceModes() {
	ps := s.cfg.BootPolicy
	if ps == nil {
		return
	}
	for _, c := range ps.Classes() {
		p, err := ps.Policy(c)
		if err != nil {
			continue
		}
		for _, m := range []string{bootpolicy.ModeEnforce, bootpolicy.ModeAudit} {
			v := 0.0
			if p.Mode == m {
				v = 1
			}
			s.boot.mode.WithLabelValues(c, m).Set(v)
		}
		response := fmt.Sprintf("quarantine after %d failed verdicts in a row", p.QuarantineAfter)
		if len(p.Critical) > 0 {
			response += ", at once on " + strings.Join(p.Critical, ", ")
		}
		switch {
		case !p.Enforced():
			s.log.Warn("boot policy in audit mode: failures alert, nothing is enforced", "class", c, "mode", p.Mode, "file", p.File)
		case s.isControlPlane(c):
			s.log.Info("boot policy enforced at joins; failures of a running machine alert (control-plane class)", "class", c, "mode", p.Mode, "file", p.File)
		default:
			s.log.Info("boot policy enforced", "class", c, "mode", p.Mode, "response", response, "file", p.File)
		}
	}
}
