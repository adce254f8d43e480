//go:build !linux

package load

import "time"

var threadStart = time.Now()

// threadCPU falls back to wall time where thread CPU clocks are not read.
func threadCPU() time.Duration { return time.Since(threadStart) }
