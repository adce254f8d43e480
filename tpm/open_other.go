//go:build !linux

package tpm

import "fmt"

// openDevice has no device transport outside Linux.
func openDevice(path string) (*TPM, error) {
	return nil, fmt.Errorf("open TPM %s: %w", path, ErrUnsupported)
}
