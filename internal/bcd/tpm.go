package bcd

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/tpmhelper"
	"github.com/nodetrust/nodetrust/tpm"
)

// bcd helper's client is the unprivileged node's TPM.
var _ agent.TPM = (*tpmhelper.Client)(nil)

// OpenTPM opens the TPM named by a config's tpm setting ("auto", "off", a
// device path or tcp://host:port) or, when helperSocket is set, connects
// to bcd helper instead (the unprivileged node never opens the device).
// No TPM is (nil, nil, nil) unless required. With spec "auto", a TPM this
// user may not open (not root, not in the tss group) is no TPM either, and
// warn says so: file keys are used. close releases what was opened.
func OpenTPM(spec, helperSocket string, required bool, warn func(string)) (t agent.TPM, close func(), err error) {
	if helperSocket != "" {
		c, err := tpmhelper.Dial(helperSocket)
		if err != nil {
			return nil, nil, fmt.Errorf("connect to bcd helper at %s (is bcd-helper.service running?): %w", helperSocket, err)
		}
		return c, func() { c.Close() }, nil
	}
	d, err := tpm.Open(spec)
	if err != nil && !required && (spec == "" || spec == "auto") && errors.Is(err, fs.ErrPermission) {
		if warn != nil {
			warn(fmt.Sprintf("the TPM (%s) cannot be opened by this user; node keys are files. Run as root, use [helper], or set tpm = \"off\" to silence this", tpm.DefaultDevice))
		}
		return nil, func() {}, nil
	}
	if errors.Is(err, tpm.ErrNoTPM) {
		if required {
			return nil, nil, fmt.Errorf("this needs a TPM, and tpm = %q found none: set tpm in config.toml (a device path or tcp://host:port)", spec)
		}
		return nil, func() {}, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open the TPM (%s): %w", spec, err)
	}
	return agent.Direct(d), func() { d.Close() }, nil
}
