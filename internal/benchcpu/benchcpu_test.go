package benchcpu

import (
	"testing"
	"time"
)

// TestProcessCountsWork checks that CPU time spent spinning shows in
// Process: a reading that stood still would make every benchmark's
// cpu-ns/op zero.
func TestProcessCountsWork(t *testing.T) {
	before := Process()
	deadline := time.Now().Add(50 * time.Millisecond)
	for n := 0; time.Now().Before(deadline); n++ {
		_ = n * n
	}
	if spent := Process() - before; spent < 10*time.Millisecond {
		t.Fatalf("50 ms of spinning counted %s of CPU time", spent)
	}
}

func BenchmarkStartReports(b *testing.B) {
	report := Start(b)
	for b.Loop() {
		_ = Process()
	}
	report()
}
