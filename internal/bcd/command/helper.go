package command

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd/tpmhelper"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/tpm"
)

func helperCommand() *cobra.Command {
	var (
		conn     connFlags
		logLevel string
	)
	c := &cobra.Command{
		Use:   "helper",
		Short: "Run as root, own the TPM, and serve its operations to the [helper] user's bcd node",
		Long: `helper opens the TPM (the tpm setting) and serves tpm.nodekey, tpm.sign, tpm.ak,
tpm.certify, tpm.release (and the tpm join's tpm.ek, tpm.activate, tpm.quote) on
the [helper] socket, to the [helper] user and root only (peer credentials are
checked on each connection). Whoever can open the TPM device could clear it, so
the unprivileged bcd node never does; it checks every answer the helper gives.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := conn.resolve()
			if err != nil {
				return err
			}
			if !cfg.Helper.Enabled() {
				return cli.Usagef("bcd helper needs a [helper] section with user = \"…\" in %s", conn.config)
			}
			if !cli.IsRoot() {
				return errors.New("bcd helper runs as root: it owns the TPM")
			}
			uid, gid, err := lookupUser(cfg.Helper.User)
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
			// Only the [helper] user reaches the socket; the peer
			// credentials are checked anyway.
			if err := os.Chown(sock, int(uid), int(gid)); err != nil {
				ln.Close()
				return err
			}
			if err := os.Chmod(sock, 0o600); err != nil {
				ln.Close()
				return err
			}
			log := cli.NewLogger(cmd.ErrOrStderr(), logLevel)
			log.Info("bcd helper serving", "socket", sock, "user", cfg.Helper.User, "uid", uid, "tpm", cfg.TPM)
			return tpmhelper.Serve(cmd.Context(), ln, t, tpmhelper.Config{AllowedUID: uid, Logger: log})
		},
	}
	conn.register(c.Flags())
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}

// lookupUser returns the uid and primary gid of a user name (or number).
func lookupUser(name string) (uid, gid uint32, err error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, nerr := strconv.Atoi(name); nerr == nil {
			u, err = user.LookupId(name)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("[helper] user %q: %w (create it, or name an existing user)", name, err)
		}
	}
	id, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, 0, err
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return 0, 0, err
	}
	return uint32(id), uint32(g), nil
}
