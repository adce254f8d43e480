package config

import "testing"

// The sample fleetd.toml in conf/fleetd loads with the real loader, so the
// documentation does not drift from the code.
func TestSampleConfigLoads(t *testing.T) {
	if _, err := LoadFleetd("../../../conf/fleetd/fleetd.toml"); err != nil {
		t.Errorf("conf/fleetd/fleetd.toml: %v", err)
	}
}
