package spireexport

import (
	"context"
	"errors"
	"fmt"

	"github.com/nodetrust/nodetrust/internal/fleetd/export"
)

// DefaultThreshold is how many nodes one run may withdraw or ban without
// the owner's allowance.
const DefaultThreshold = 1

// Safeguards is where a run learns whether the owner allowed a held change
// and records what it did: fleetd itself (fleetd serve) or, for fleetd
// export spire, fleetd's export endpoints.
type Safeguards interface {
	// Allowed says whether the owner allowed the change with this digest.
	Allowed(ctx context.Context, digest string) (bool, error)
	// Record records a run (metrics, audit, held changes).
	Record(ctx context.Context, r export.Run) error
}

// SPIRE is what the applier needs of a SPIRE server (*Client).
type SPIRE interface {
	FleetOwned(ctx context.Context) ([]Entry, error)
	FindAgents(ctx context.Context, trustDomain string, d export.Device, skip map[string]bool) ([]Agent, error)
	Apply(ctx context.Context, trustDomain string, p Plan) []string
}

// Applier applies exports to a SPIRE server with the safeguards.
type Applier struct {
	SPIRE      SPIRE
	Safeguards Safeguards
	// TrustDomain is the trust domain the export must name.
	TrustDomain string
	// Threshold is how many nodes a run may withdraw or ban at once
	// (default DefaultThreshold; more wait for the owner's allowance).
	Threshold int
}

// Result is one run: its plan (empty when the export could not be read)
// and its record.
type Result struct {
	Plan Plan
	Run  export.Run
}

// ErrHeld is a run a safeguard held back; errors.Is finds it in what Run
// returns, whose message says why and what to do.
var ErrHeld = errors.New("held by a safeguard")

// Run applies one export (the envelope's bytes). With dryRun it plans and
// changes nothing, records nothing. It returns an error wrapping ErrHeld
// when a safeguard held the change, and one naming the failures when
// some changes failed; the result says what it did either way.
func (a *Applier) Run(ctx context.Context, data []byte, dryRun bool) (Result, error) {
	threshold := a.Threshold
	if threshold <= 0 {
		threshold = DefaultThreshold
	}
	res := Result{}
	doc, digest, err := export.Parse(data, a.TrustDomain)
	if err != nil {
		res.Run = export.Run{Outcome: export.OutcomeHeld, HeldReason: export.HeldMalformed,
			Held: "the export could not be read or verified: SPIRE entries preserved (" + err.Error() + ")", Summary: "nothing changed"}
		return a.finish(ctx, res, dryRun)
	}
	res.Run.Digest = digest
	if len(doc.Devices) == 0 {
		res.Run = export.Run{Digest: digest, Outcome: export.OutcomeHeld, HeldReason: export.HeldEmpty,
			Held: "the export lists no eligible device: SPIRE entries preserved (an empty device list is taken for a fault of the inventory, not a withdrawal of the fleet)", Summary: "nothing changed"}
		return a.finish(ctx, res, dryRun)
	}
	fleet, err := a.SPIRE.FleetOwned(ctx)
	if err != nil {
		res.Run = export.Run{Digest: digest, Outcome: export.OutcomeFailed, Errors: []string{err.Error()}, Summary: "nothing changed: the SPIRE server could not be read"}
		return a.finish(ctx, res, dryRun)
	}
	p := Diff(doc, fleet)
	p.Digest = digest
	// ask asks, once, whether the owner allowed this digest. Before any
	// change it is asked in any case: for fleetd export spire it is also
	// the check that the credential may apply the export at all.
	allowed, asked := false, false
	ask := func() error {
		if asked || a.Safeguards == nil {
			return nil
		}
		asked = true
		var err error
		if allowed, err = a.Safeguards.Allowed(ctx, digest); err != nil {
			return fmt.Errorf("ask fleetd whether %s is allowed: %w", digest, err)
		}
		return nil
	}
	failed := func(err error, what string) (Result, error) {
		res.Plan = p
		res.Run = runOf(p, export.OutcomeFailed)
		res.Run.Errors = []string{err.Error()}
		res.Run.Summary = what + ": " + res.Run.Summary
		return a.finish(ctx, res, dryRun)
	}
	if len(p.Withdrawn) > threshold {
		if err := ask(); err != nil {
			return failed(err, "nothing changed")
		}
	}
	// The agents of a mass withdrawal are looked up only once it is
	// allowed: a held change costs no SPIRE call per node.
	if len(p.Withdrawn) <= threshold || allowed {
		skip := map[string]bool{}
		for _, c := range p.Delete {
			skip[c.Entry.ID] = true
		}
		found := map[string][]Agent{}
		for _, d := range Suspects(doc, p) {
			agents, err := a.SPIRE.FindAgents(ctx, doc.TrustDomain, d, skip)
			if err != nil {
				return failed(err, "nothing changed")
			}
			found[d.NodeID] = agents
		}
		p = Bans(doc, p, found)
	}
	res.Plan = p
	over := max(len(p.Nodes()), len(p.Withdrawn)) > threshold
	if over {
		if err := ask(); err != nil {
			return failed(err, "nothing changed")
		}
	}
	if over && !allowed {
		res.Run = runOf(p, export.OutcomeHeld)
		res.Run.HeldReason = export.HeldThreshold
		res.Run.Held = fmt.Sprintf("the export would withdraw or ban %d nodes at once (threshold %d): nothing changed until the owner allows it (fleetd export allow --digest %s)",
			max(len(p.Nodes()), len(p.Withdrawn)), threshold, digest)
		return a.finish(ctx, res, dryRun)
	}
	if p.Empty() {
		res.Run = runOf(p, export.OutcomeUnchanged)
		return a.finish(ctx, res, dryRun)
	}
	if dryRun {
		res.Run = runOf(p, "dry-run")
		return res, nil
	}
	if err := ask(); err != nil {
		return failed(err, "nothing changed")
	}
	errs := a.SPIRE.Apply(ctx, doc.TrustDomain, p)
	outcome := export.OutcomeApplied
	if len(errs) > 0 {
		outcome = export.OutcomeFailed
	}
	res.Run = runOf(p, outcome)
	res.Run.Errors = errs
	return a.finish(ctx, res, false)
}

func runOf(p Plan, outcome string) export.Run {
	return export.Run{Digest: p.Digest, Outcome: outcome, Create: len(p.Create), Update: len(p.Update), Delete: len(p.Delete), Ban: len(p.Ban),
		Kept: len(p.Kept), Pending: len(p.Pending), Nodes: p.Nodes(), Summary: p.Summary()}
}

// finish records the run (unless dryRun) and returns its error.
func (a *Applier) finish(ctx context.Context, res Result, dryRun bool) (Result, error) {
	var err error
	switch res.Run.Outcome {
	case export.OutcomeHeld:
		err = fmt.Errorf("%w: %s", ErrHeld, res.Run.Held)
	case export.OutcomeFailed:
		err = fmt.Errorf("SPIRE export run failed: %s", capList(res.Run.Errors, 5))
	}
	if dryRun || a.Safeguards == nil {
		return res, err
	}
	if rerr := a.Safeguards.Record(ctx, res.Run); rerr != nil {
		return res, errors.Join(err, fmt.Errorf("record the run: %w", rerr))
	}
	return res, err
}
