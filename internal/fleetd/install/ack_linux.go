package install

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Linux TCP states (include/net/tcp_states.h) in which the peer may still
// acknowledge what was sent: the connection is open, or the peer closed
// its side after reading (a reset or a timeout ends in TCP_CLOSE).
const (
	tcpEstablished = 1
	tcpCloseWait   = 8
)

// readCounters reads what the kernel knows of c's sent bytes: how many the
// peer acknowledged (tcpi_bytes_acked, Linux 4.1 and later) and how many
// sit in the send queue unacknowledged or unsent (SIOCOUTQ).
func readCounters(c *net.TCPConn) (counters, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return counters{}, fmt.Errorf("TCP counters: %w", err)
	}
	var (
		out     counters
		callErr error
	)
	err = raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			callErr = fmt.Errorf("TCP_INFO: %w", err)
			return
		}
		queued, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		if err != nil {
			callErr = fmt.Errorf("SIOCOUTQ: %w", err)
			return
		}
		out = counters{acked: info.Bytes_acked, queued: uint64(max(queued, 0)),
			open: info.State == tcpEstablished || info.State == tcpCloseWait}
	})
	if err == nil {
		err = callErr
	}
	if err != nil {
		return counters{}, fmt.Errorf("TCP counters: %w", err)
	}
	return out, nil
}
