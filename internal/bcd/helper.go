package bcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/tpmhelper"
	"github.com/nodetrust/nodetrust/tpm"
)

// RunHelper runs bcd helper until ctx ends: it opens the TPM config.toml
// names and serves its operations on the [helper] socket to the [helper]
// user (and root) only. The caller checks that [helper] is set and that
// the process runs as root.
func RunHelper(ctx context.Context, cfg *config.BCD, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	uid, gid, err := cfg.Helper.IDs()
	if err != nil {
		return err
	}
	t, err := tpm.Open(cfg.TPM)
	if err != nil {
		return fmt.Errorf("open the TPM (tpm = %q): %w", cfg.TPM, err)
	}
	defer t.Close()
	sock := cfg.Helper.Socket
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		return err
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the stale socket %s: %w", sock, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	// Only the [helper] user reaches the socket; the peer credentials are
	// checked anyway.
	if err := os.Chown(sock, int(uid), int(gid)); err != nil {
		ln.Close()
		return err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return err
	}
	log.Info("bcd helper serving", "socket", sock, "user", cfg.Helper.User, "uid", uid, "tpm", cfg.TPM)
	return tpmhelper.Serve(ctx, ln, t, tpmhelper.Config{AllowedUID: uid, Logger: log})
}
