//go:build unix

package fleetd

import "syscall"

// openFileLimit is the process's open-file limit (RLIMIT_NOFILE, the soft
// limit, which Go raises to the hard limit at start), or 0 when unknown.
func openFileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}
