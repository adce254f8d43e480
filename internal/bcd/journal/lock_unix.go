//go:build unix

package journal

import (
	"fmt"
	"os"
	"syscall"
)

// lockDir takes an exclusive advisory lock on the directory dir itself, so
// that concurrent Opens, in this process or another, decide one at a time
// whether the journal is missing or corrupt and what to move aside. It
// creates no file. The returned function releases the lock.
func lockDir(dir string) (func(), error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(d.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	// Closing the descriptor releases the lock.
	return func() { d.Close() }, nil
}
