package install

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The outcomes of a fetch, the label of nodetrust_config_fetches_total.
const (
	OutcomeReleased       = "released"       // delivered, acknowledged, burned
	OutcomeUnauthorized   = "unauthorized"   // no code, a malformed or wrong one, or an unknown UUID
	OutcomeSpent          = "spent"          // the right code, already burned
	OutcomeExpired        = "expired"        // the right code, past the config's expiry
	OutcomeBusy           = "busy"           // another fetch holds the claim
	OutcomeBadRequest     = "bad_request"    // a malformed UUID or a request with a body
	OutcomeWriteFailed    = "write_failed"   // the response could not be written whole; the code stays valid
	OutcomeUnacknowledged = "unacknowledged" // written, not acknowledged in time; the code stays valid
	OutcomeUnconfirmable  = "unconfirmable"  // no TCP connection to ask; the code stays valid
	OutcomeBurnLost       = "burn_lost"      // acknowledged, but the claim was lost before the burn
	OutcomeStoreError     = "store_error"    // the store failed; nothing was decided
)

type metrics struct {
	issued      prometheus.Counter
	fetches     *prometheus.CounterVec
	activations *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodetrust_install_codes_issued_total",
			Help: "Install codes issued: configs sealed for release.",
		}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_config_fetches_total",
			Help: "Config fetches (GET /v1/config/{uuid}) by outcome: released, unauthorized, spent, expired, busy, bad_request, write_failed, unacknowledged, unconfirmable, burn_lost, store_error.",
		}, []string{"outcome"}),
		activations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodetrust_config_activations_total",
			Help: "Activations after a config release by outcome: active, refused (settled without activating), retry (failed, to be retried).",
		}, []string{"outcome"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.issued, m.fetches, m.activations} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("install: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
