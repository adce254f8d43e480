package fleetd

import (
	"fmt"

	"github.com/nodetrust/nodetrust/internal/fileperm"
)

// checkKubeconfig refuses a kubeconfig (named key in fleetd.toml) that
// others may read, since it holds fleetd's credential in a cluster, or that
// group or others may write, since whoever writes it chooses what fleetd
// runs (an exec credential plugin) and which cluster it trusts.
func checkKubeconfig(key, path string) error {
	others, mode, err := fileperm.OthersCanRead(path)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	switch {
	case others:
		return fmt.Errorf("%s: %s has mode %04o and holds fleetd's credential in the cluster: chmod 600 %s", key, path, mode, path)
	case mode&0o022 != 0:
		return fmt.Errorf("%s: %s has mode %04o: group or others may write it, and so choose what fleetd runs and trusts: chmod 600 %s", key, path, mode, path)
	}
	return nil
}
