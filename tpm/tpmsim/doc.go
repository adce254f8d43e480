// Package tpmsim opens the in-process TPM 2.0 reference simulator
// (github.com/google/go-tpm-tools/simulator, Microsoft's reference code
// built with cgo) for tests. No release binary uses it: bcd opens a TPM
// device or a TPM over TCP (swtpm), and tests that run the real binaries
// use swtpm.
//
// The simulator is only built with the build tag tpmsim (and cgo):
//
//	CGO_ENABLED=1 go test -tags tpmsim ./tpm/...
//
// Without the tag, [Open] and [OpenTransport] return [ErrDisabled], so release
// builds (CGO_ENABLED=0) do not need cgo.
//
// The simulator is one process-wide instance: a second Open waits until the
// first is closed. Each Open starts from a freshly manufactured TPM (new
// hierarchy seeds, empty NV), as if the TPM were replaced.
package tpmsim
