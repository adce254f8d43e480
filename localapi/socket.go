package localapi

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
)

// MaxSocketPath is the longest path a unix socket address holds on Linux
// (sun_path is 108 bytes with its terminating zero).
const MaxSocketPath = 107

// UnixPath calls fn with an address for the unix socket at path: path
// itself, or, for a path too long for a socket address on Linux, the same
// file reached through /proc/self/fd and an open descriptor of its
// directory.
func UnixPath(path string, fn func(addr string) error) error {
	if len(path) <= MaxSocketPath || runtime.GOOS != "linux" {
		return fn(path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("open the directory of socket %s: %w", path, err)
	}
	defer dir.Close()
	return fn(fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
}

// DialUnix connects to the unix socket at path, however long the path.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var c net.Conn
	err := UnixPath(path, func(addr string) error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "unix", addr)
		return err
	})
	return c, err
}
