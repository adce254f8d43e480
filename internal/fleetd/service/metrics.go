package service

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/connlimit"
)

// metrics are the control plane's counters, served at /metrics on the
// HTTPS listener. Refused and invalid requests are counted here rather
// than written to the audit trail, so hostile traffic costs no store
// write.
type metrics struct {
	reg         *prometheus.Registry
	joins       *prometheus.CounterVec
	intakes     *prometheus.CounterVec
	installs    *prometheus.CounterVec
	renewals    *prometheus.CounterVec
	revocations *prometheus.CounterVec
	adminCalls  *prometheus.CounterVec
	claims      *prometheus.CounterVec
	transitions *prometheus.CounterVec
	// The revocation feed (revfeed.go): the sessions subscribed,
	// catch-ups sent by why they were owed, those cut at
	// revFeedCatchUpMax, and the certificates pushed as they were
	// revoked.
	feedSubscribers prometheus.GaugeFunc
	feedCatchUps    *prometheus.CounterVec
	feedTruncated   prometheus.Counter
	feedPushed      prometheus.Counter
	// Hostile traffic, counted rather than journaled (docs/security.md).
	joinRefusals  *prometheus.CounterVec
	oversized     *prometheus.CounterVec
	connRefused   *prometheus.CounterVec
	connDisplaced *prometheus.CounterVec
	auditDropped  prometheus.Counter
	logDropped    prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_join_requests_total",
			Help: "Join requests by attestor and outcome (signed, challenge, pending, refused, failed).",
		}, []string{"attestor", "outcome"}),
		intakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_intake_requests_total",
			Help: "Intake requests by outcome: issued, challenge, failed, or refused_<reason> (csr_invalid, tpm_evidence, tpm_challenge, not_admitted, boot_policy).",
		}, []string{"outcome"}),
		installs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_install_requests_total",
			Help: "Install requests by outcome: issued, failed, or refused_<rule> (intake-session, ldevid, confirmation, render, or an admission rule: declared, expected-port, network-report-age, …).",
		}, []string{"outcome"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_renewals_total",
			Help: "Renewals by outcome: the gRPC code name, OK for an issued certificate.",
		}, []string{"code"}),
		revocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_revocations_total",
			Help: "Node revocations by cause (revoke, delete, clone).",
		}, []string{"cause"}),
		adminCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_admin_calls_total",
			Help: "Admin calls by method and outcome (refused: the role may not; else the gRPC code name).",
		}, []string{"method", "outcome"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_join_claims_total",
			Help: "Joins kept as claims (not admitted) by attestor.",
		}, []string{"attestor"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_lifecycle_transitions_total",
			Help: "Lifecycle actions carried out (provision, quarantine, release, retire).",
		}, []string{"action"}),
		feedSubscribers: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodetrust_revocation_feed_subscribers",
			Help: "Node sessions subscribed to the revocation feed on this server.",
		}, func() float64 { return float64(s.revfeed.subscribers()) }),
		feedCatchUps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_revocation_feed_catchups_total",
			Help: "Revocation feed catch-ups sent to subscribed sessions, by reason (subscribe, fell_behind: the session's queue overflowed, read_failed: a revocation's certificates could not be read, write_failed).",
		}, []string{"reason"}),
		feedTruncated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodetrust_revocation_feed_catchups_truncated_total",
			Help: fmt.Sprintf("Revocation feed catch-ups sent cut at their bound of %d certificates: more revoked certificates had not expired.", revFeedCatchUpMax),
		}),
		feedPushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodetrust_revocation_feed_certs_pushed_total",
			Help: "Revoked certificates pushed to subscribed sessions as they were revoked, one per session told (catch-ups not counted).",
		}),
		joinRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_join_refusals_total",
			Help: "Refused joins by reason (csr_invalid, token_used, oversized, …).",
		}, []string{"reason"}),
		oversized: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_oversized_requests_total",
			Help: "Requests refused for their size, by method.",
		}, []string{"method"}),
		connRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_connections_refused_total",
			Help: "Connections refused over a limit, by listener and limit (total, per_source, handshakes).",
		}, []string{"listener", "limit"}),
		connDisplaced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_connections_displaced_total",
			Help: "Idle connections closed to admit another source's, by listener and limit.",
		}, []string{"listener", "limit"}),
		auditDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodetrust_refusal_audits_dropped_total",
			Help: "Join refusals not audited: the token and reason already have a record in this window.",
		}),
		logDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodetrust_refusal_log_lines_dropped_total",
			Help: "Refusal log lines dropped by the per-reason-and-source throttle.",
		}),
	}
	m.reg.MustRegister(m.joins, m.intakes, m.installs, m.renewals, m.revocations, m.adminCalls, m.claims, m.transitions,
		m.feedSubscribers, m.feedCatchUps, m.feedTruncated, m.feedPushed,
		m.joinRefusals, m.oversized, m.connRefused, m.connDisplaced, m.auditDropped, m.logDropped,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodetrust_live_sessions",
			Help: "Node sessions held open on this server.",
		}, func() float64 { return float64(s.sessions.count()) }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// knownAttestor bounds the attestor label to values the server knows, so
// a caller cannot grow the metric's label set.
func knownAttestor(a string) string {
	switch a {
	case "token", "tpm":
		return a
	}
	return "other"
}

func (m *metrics) join(attestor, outcome string) {
	m.joins.WithLabelValues(knownAttestor(attestor), outcome).Inc()
}

func (m *metrics) renewal(c codes.Code) { m.renewals.WithLabelValues(c.String()).Inc() }

func (m *metrics) revocation(cause string) { m.revocations.WithLabelValues(cause).Inc() }

// revocationsSent counts rc as its write to a subscribed session starts
// (so that a node that received it sees it counted): a catch-up owed for
// reason, or certificates pushed (reason unused).
func (m *metrics) revocationsSent(rc *gatewayv1.RevokedCerts, reason string) {
	if !rc.GetCatchUp() {
		m.feedPushed.Add(float64(len(rc.GetCerts())))
		return
	}
	m.feedCatchUps.WithLabelValues(reason).Inc()
	if rc.Truncated {
		m.feedTruncated.Inc()
	}
}

func (m *metrics) adminCall(method, outcome string) {
	m.adminCalls.WithLabelValues(method, outcome).Inc()
}

func (m *metrics) claim(attestor string) { m.claims.WithLabelValues(knownAttestor(attestor)).Inc() }

func (m *metrics) transition(action string) { m.transitions.WithLabelValues(action).Inc() }

// watchListener serves the open and handshaking connections of l.
func (m *metrics) watchListener(name string, l *connlimit.Listener) {
	labels := prometheus.Labels{"listener": name}
	_ = m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nodetrust_connections_open", Help: "Connections held, by listener.", ConstLabels: labels,
	}, func() float64 { return float64(l.Stats().Open) }))
	_ = m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nodetrust_connections_handshaking", Help: "Connections whose handshake has not finished, by listener.", ConstLabels: labels,
	}, func() float64 { return float64(l.Stats().Handshaking) }))
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// MetricsRegistry is where other parts of fleetd served on the HTTPS
// listener (the config release) register their counters, so that /metrics
// serves them too.
func (s *Server) MetricsRegistry() prometheus.Registerer { return s.metrics.reg }
