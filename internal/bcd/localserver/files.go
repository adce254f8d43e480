package localserver

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/nodetrust/nodetrust/internal/atomicfile"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/localapi"
)

// privateDir makes dir with mode 0700, or checks that an existing one is
// the daemon user's alone.
func privateDir(dir, setting string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make %s: %w; run bcd node as the user the data directory belongs to", dir, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("check %s: %w", dir, err)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return fmt.Errorf("%s has mode %04o, so other users could reach what it holds: chmod 700 %s, or set %s to a path in a directory of mode 0700", dir, m, dir, setting)
	}
	return nil
}

// cliKey returns the public key of the command line's key file in dir
// (the credentials directory), making the key at the first start. It
// reports whether it made it.
func cliKey(dir string) (ed25519.PublicKey, bool, error) {
	if err := privateDir(dir, "data_dir"); err != nil {
		return nil, false, err
	}
	path := filepath.Join(dir, datadir.CLIKeyFile) // dir is the layout's Credentials()
	key, err := localapi.ReadKeyFile(path)
	if err == nil {
		return key.Public().(ed25519.PublicKey), false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("make the command line's key: %w", err)
	}
	b, err := localapi.MarshalKey(priv)
	clear(priv)
	if err != nil {
		return nil, false, err
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return nil, false, fmt.Errorf("store the command line's key: %w", err)
	}
	return pub, true, nil
}

// listenSocket listens on the unix socket path with mode 0600, in a
// directory of mode 0700. A socket left by a daemon that is gone is
// replaced; one that a running daemon serves is an error. The caller
// removes the socket after closing the listener.
func listenSocket(path string) (net.Listener, error) {
	if err := privateDir(filepath.Dir(path), "[local_api] socket"); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := localapi.DialUnix(ctx, path)
		cancel()
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("another bcd node serves %s: stop it first", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove the stale socket %s: %w", path, err)
		}
	}
	var l *net.UnixListener
	err := localapi.UnixPath(path, func(addr string) error {
		a, err := net.ResolveUnixAddr("unix", addr)
		if err != nil {
			return err
		}
		l, err = net.ListenUnix("unix", a)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// A long path is bound through /proc/self/fd, which is gone by the
	// time the listener closes: the caller removes the socket by its path.
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		os.Remove(path)
		return nil, fmt.Errorf("make %s mode 0600: %w", path, err)
	}
	return l, nil
}
