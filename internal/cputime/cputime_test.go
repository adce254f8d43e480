package cputime

import (
	"testing"
	"time"
)

// TestProcessCountsWork checks that CPU time spent spinning shows in
// Process: a reading that stood still would make every benchmark's
// cpu-ns/op and the load tool's own CPU zero.
func TestProcessCountsWork(t *testing.T) {
	before := Process()
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; Process()-before < 20*time.Millisecond; n++ {
		if time.Now().After(deadline) {
			t.Fatalf("10 s of spinning counted %s of CPU time", Process()-before)
		}
		_ = n * n
	}
}
