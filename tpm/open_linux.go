package tpm

import (
	"fmt"

	"github.com/google/go-tpm/tpm2/transport/linuxtpm"
)

// openDevice opens a TPM character device such as /dev/tpmrm0.
func openDevice(path string) (*TPM, error) {
	t, err := linuxtpm.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open TPM %s: %w", path, err)
	}
	return New(t, t), nil
}
