// Package cputime reads the CPU time this process has used, so that a
// benchmark or the load tool can report what an operation cost rather than
// how long it waited: on a shared machine, or where an operation waits on
// fdatasync, wall time says little about cost.
package cputime

import (
	"syscall"
	"time"
)

// Process returns this process's CPU time so far, user and system, all
// threads (the store's writer and the collector included); zero if the
// kernel does not say.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
