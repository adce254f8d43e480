package tpmhelper

import (
	"fmt"
	"net"
	"syscall"
)

// peerCred returns the uid and pid of the process at the other end of c,
// as the kernel recorded them when it connected (SO_PEERCRED, socket(7)).
func peerCred(c *net.UnixConn) (uid uint32, pid int32, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("read the caller's credentials: %w", err)
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, 0, fmt.Errorf("read the caller's credentials: %w", err)
	}
	if credErr != nil {
		return 0, 0, fmt.Errorf("read the caller's credentials (SO_PEERCRED): %w", credErr)
	}
	return cred.Uid, cred.Pid, nil
}
