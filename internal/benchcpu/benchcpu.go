// Package benchcpu reports a benchmark's CPU time per operation beside the
// wall time the testing package measures. On a machine the benchmark
// shares, or where an operation waits on fdatasync, the wall time says
// little about cost; the CPU time of the whole process (every thread: the
// store's writer, the collector) is the figure to compare.
package benchcpu

import (
	"testing"

	"github.com/nodetrust/nodetrust/internal/cputime"
)

// Start begins measuring b's CPU time; the function it returns reports
// the CPU time per operation since Start as the metric "cpu-ns/op". Call
// it where the timed part ends.
func Start(b *testing.B) (report func()) {
	start := cputime.Process()
	return func() {
		b.ReportMetric(float64(cputime.Process()-start)/float64(b.N), "cpu-ns/op")
	}
}
