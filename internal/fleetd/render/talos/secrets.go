package talos

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"gopkg.in/yaml.v3"
)

// GenerateSecrets writes a new cluster secrets bundle (Talos's own format,
// as talosctl gen secrets writes it) to path with mode 0600. It never
// replaces a file: a cluster's secrets are made once, and a second bundle
// would split the cluster. talosVersion is the version contract ("" for
// machinery's own).
func GenerateSecrets(path, talosVersion string) error {
	var contract *config.VersionContract
	if talosVersion != "" {
		var err error
		if contract, err = config.ParseContractFromVersion(talosVersion); err != nil {
			return fmt.Errorf("talos version %q: %w", talosVersion, err)
		}
	}
	bundle, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), contract)
	if err != nil {
		return fmt.Errorf("generate the secrets bundle: %w", err)
	}
	data, err := yaml.Marshal(bundle)
	if err != nil {
		return fmt.Errorf("encode the secrets bundle: %w", err)
	}
	return writeNew(path, data)
}

// writeNew writes data to a new file at path (mode 0600), whole or not at
// all: to a temporary file in the same folder, synced, then linked into
// place, which fails if path exists.
func writeNew(path string, data []byte) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".secrets-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if os.IsExist(err) {
			return fmt.Errorf("%s exists: a cluster's secrets are generated once; choose another file, or remove it if no cluster uses it", path)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
