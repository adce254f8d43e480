package service

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
)

// metrics are the control plane's counters, served at /metrics on the
// HTTPS listener. Refused and invalid requests are counted here rather
// than written to the audit trail, so hostile traffic costs no store
// write.
type metrics struct {
	reg         *prometheus.Registry
	joins       *prometheus.CounterVec
	renewals    *prometheus.CounterVec
	revocations *prometheus.CounterVec
	adminCalls  *prometheus.CounterVec
	claims      *prometheus.CounterVec
	transitions *prometheus.CounterVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_join_requests_total",
			Help: "Join requests by attestor and outcome (signed, challenge, pending, refused, failed).",
		}, []string{"attestor", "outcome"}),
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
	}
	m.reg.MustRegister(m.joins, m.renewals, m.revocations, m.adminCalls, m.claims, m.transitions,
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

func (m *metrics) adminCall(method, outcome string) {
	m.adminCalls.WithLabelValues(method, outcome).Inc()
}

func (m *metrics) claim(attestor string) { m.claims.WithLabelValues(knownAttestor(attestor)).Inc() }

func (m *metrics) transition(action string) { m.transitions.WithLabelValues(action).Inc() }

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
