//go:build tpmsim

package tpmsim

import (
	"errors"
	"fmt"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodetrust/nodetrust/tpm"
)

// ErrDisabled is returned by Open and OpenTransport in a build without the
// tpmsim tag. In this build it is never returned.
var ErrDisabled = errors.New("tpmsim: the TPM simulator is not built in: build with -tags tpmsim and CGO_ENABLED=1")

// Enabled reports whether the simulator is built in.
const Enabled = true

// Open manufactures a fresh simulated TPM and returns it; its Close releases
// the simulator for the next Open.
func Open() (*tpm.TPM, error) {
	t, err := OpenTransport()
	if err != nil {
		return nil, err
	}
	return tpm.New(t, t), nil
}

// OpenTransport is Open as a go-tpm transport, for tests that send commands
// of their own (defining NV indices with platform authorization, say) and
// then pass it to tpm.New.
func OpenTransport() (transport.TPMCloser, error) {
	sim, err := simulator.Get()
	if err != nil {
		return nil, fmt.Errorf("tpmsim: start the TPM simulator: %w", err)
	}
	return &simTransport{sim: sim}, nil
}

type simTransport struct {
	sim *simulator.Simulator
}

func (s *simTransport) Send(cmd []byte) ([]byte, error) {
	return tpmutil.RunCommandRaw(s.sim, cmd)
}

func (s *simTransport) Close() error {
	if s.sim.IsClosed() {
		return nil
	}
	return s.sim.Close()
}
