package fleetd

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/postgres"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
)

// openStore opens the store fleetd.toml selects: the SQLite file, or the
// PostgreSQL database several replicas share.
func openStore(ctx context.Context, cfg *config.Fleetd) (store.Store, error) {
	switch cfg.Store.Driver {
	case "postgres":
		o := postgres.Options{MaxConns: int32(cfg.Store.MaxConns)}
		if f := cfg.Store.PasswordFile; f != "" {
			pw, err := readPasswordFile(cfg.Resolve(f))
			if err != nil {
				return nil, err
			}
			o.Password = pw
		}
		return postgres.Open(ctx, cfg.Store.URL, o)
	default:
		return sqlite.Open(ctx, cfg.Resolve(cfg.Store.Path))
	}
}

// readPasswordFile reads store.password_file: one line, readable by its
// owner only.
func readPasswordFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("store.password_file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("store.password_file: %s has mode %04o, readable by others; chmod 0600 %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("store.password_file: %w", err)
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" || strings.ContainsAny(pw, "\r\n") {
		return "", fmt.Errorf("store.password_file: %s must hold the password on one line", path)
	}
	return pw, nil
}
