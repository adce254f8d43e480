//go:build !linux

package tpmhelper

import (
	"fmt"
	"net"
)

// peerCred returns ErrUnsupported: peer credentials are read on Linux only,
// so the helper refuses every caller elsewhere.
func peerCred(*net.UnixConn) (uid uint32, pid int32, err error) {
	return 0, 0, fmt.Errorf("read the caller's credentials: %w", ErrUnsupported)
}
