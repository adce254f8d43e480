//go:build !tpmsim

package tpmsim

import (
	"errors"

	"github.com/google/go-tpm/tpm2/transport"

	"github.com/nodetrust/nodetrust/tpm"
)

// ErrDisabled is returned by Open and OpenTransport in a build without the
// tpmsim tag.
var ErrDisabled = errors.New("tpmsim: the TPM simulator is not built in: build with -tags tpmsim and CGO_ENABLED=1")

// Enabled reports whether the simulator is built in.
const Enabled = false

// Open returns ErrDisabled: this build has no simulator.
func Open() (*tpm.TPM, error) { return nil, ErrDisabled }

// OpenTransport returns ErrDisabled: this build has no simulator.
func OpenTransport() (transport.TPMCloser, error) { return nil, ErrDisabled }
