// Package benchcpu reports a benchmark's CPU time per operation beside the
// wall time the testing package measures. On a machine the benchmark
// shares, or where an operation waits on fdatasync, the wall time says
// little about cost; the CPU time of the whole process (every thread: the
// store's writer, the collector) is the figure to compare.
package benchcpu

import (
	"syscall"
	"testing"
	"time"
)

// Process returns this process's CPU time so far, user and system, all
// threads; zero if the kernel does not say.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Start begins measuring b's CPU time; the function it returns reports
// the CPU time per operation since Start as the metric "cpu-ns/op". Call
// it where the timed part ends.
func Start(b *testing.B) (report func()) {
	start := Process()
	return func() {
		b.ReportMetric(float64(Process()-start)/float64(b.N), "cpu-ns/op")
	}
}
