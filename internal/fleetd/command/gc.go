package command

import (
	"runtime/debug"
	"strconv"
)

// serveGCPercent is the garbage collector's target fleetd serve runs
// with when the environment sets no GOGC. A control plane's steady cost is
// the memory of its held sessions; its CPU goes to joins and renewals,
// which a fleet makes rarely (a renewal per node every several hours).
// Under Go's default of 100 the resident memory of many held sessions is
// about twice their live heap; at 50 it is about 1.5 times, for about 10%
// more CPU per renewal (docs/performance.md, issue 20 part 5).
const serveGCPercent = 50

// applyServeGC sets the garbage collector's target to serveGCPercent
// unless getenv("GOGC") names one, which Go's runtime has applied
// already. It returns the target in force, as GOGC spells it, and whether
// it set it.
func applyServeGC(getenv func(string) string) (gogc string, set bool) {
	if v := getenv("GOGC"); v != "" {
		return v, false
	}
	debug.SetGCPercent(serveGCPercent)
	return strconv.Itoa(serveGCPercent), true
}
