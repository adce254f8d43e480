package config

import (
	"fmt"
	"slices"
	"time"
)

// Export configures the SPIRE registration export (docs/spire.md).
type Export struct {
	// EligibleStates are the node states the export lists as eligible
	// (default ["active"]); retired nodes are always listed as retired.
	EligibleStates []string    `toml:"eligible_states"`
	SPIRE          ExportSPIRE `toml:"spire"`
}

// ExportSPIRE configures the applier inside fleetd serve.
type ExportSPIRE struct {
	// Socket is the SPIRE server's admin Unix socket; empty: fleetd serve
	// applies nothing (fleetd export spire may, from elsewhere).
	Socket string `toml:"socket"`
	// Interval is how often fleetd serve applies the export (default 1m);
	// a retirement applies it at once too.
	Interval Duration `toml:"interval"`
	// Threshold is how many nodes one run may withdraw or ban without the
	// owner's allowance (default 1).
	Threshold int `toml:"threshold"`
	// PageSize is how many entries one ListEntries call returns (default
	// 500).
	PageSize int `toml:"page_size"`
}

// exportStates are the states an export may call eligible.
var exportStates = []string{"active", "quarantined", "provisioning", "revoked"}

func (e *Export) applyDefaults() {
	if e.EligibleStates == nil {
		e.EligibleStates = []string{"active"}
	}
	if e.SPIRE.Interval.Duration == 0 {
		e.SPIRE.Interval.Duration = time.Minute
	}
	if e.SPIRE.Threshold == 0 {
		e.SPIRE.Threshold = 1
	}
	if e.SPIRE.PageSize == 0 {
		e.SPIRE.PageSize = 500
	}
}

func (e *Export) validate() error {
	for _, s := range e.EligibleStates {
		if !slices.Contains(exportStates, s) {
			return fmt.Errorf("export.eligible_states: %q is not one of %v (retired nodes are exported as retired)", s, exportStates)
		}
	}
	if e.SPIRE.Interval.Duration < time.Second {
		return fmt.Errorf("export.spire.interval: %s is shorter than 1s", e.SPIRE.Interval.Duration)
	}
	if e.SPIRE.Threshold < 1 {
		return fmt.Errorf("export.spire.threshold: %d; at least 1 (the number of nodes one run may withdraw or ban without the owner's allowance)", e.SPIRE.Threshold)
	}
	if e.SPIRE.PageSize < 1 || e.SPIRE.PageSize > 10000 {
		return fmt.Errorf("export.spire.page_size: %d is not between 1 and 10000", e.SPIRE.PageSize)
	}
	return nil
}
