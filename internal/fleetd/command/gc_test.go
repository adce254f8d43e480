package command

import (
	"runtime/debug"
	"testing"
)

// TestApplyServeGC: fleetd serve lowers the collector's target to 50
// when GOGC is unset, and leaves an operator's GOGC alone.
func TestApplyServeGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	gogc, set := applyServeGC(func(string) string { return "" })
	if got := debug.SetGCPercent(100); got != serveGCPercent || gogc != "50" || !set {
		t.Errorf("without GOGC: target %d, reported %q (set %t); want %d, \"50\", set", got, gogc, set, serveGCPercent)
	}

	gogc, set = applyServeGC(func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	})
	if got := debug.SetGCPercent(100); got != 100 || gogc != "200" || set {
		t.Errorf("with GOGC=200: target %d, reported %q (set %t); want the runtime's 100 untouched, \"200\", not set", got, gogc, set)
	}
}
