package benchcpu

import (
	"testing"
	"time"
)

// BenchmarkStartReports runs Start's report over work that costs CPU, so
// that bench-smoke sees it report.
func BenchmarkStartReports(b *testing.B) {
	report := Start(b)
	for b.Loop() {
		_ = time.Now()
	}
	report()
}
