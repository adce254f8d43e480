package agent

import (
	"context"
	"crypto"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"

	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/bcd/tpmhelper"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
)

// Keys makes and loads node keys: in the TPM when there is one, else as
// PKCS#8 files. The same signatures come out either way.
type Keys struct {
	// TPM is the host's TPM (directly, or through bcd helper), or nil for
	// file keys.
	TPM tpmhelper.TPM
}

// New makes a node key and returns it with the bytes node.key holds for
// it (a PKCS#8 key, or a TPM record) and its kind (identity.KeyKindFile or
// identity.KeyKindTPM).
func (k Keys) New(ctx context.Context) (crypto.Signer, []byte, string, error) {
	if k.TPM == nil {
		key, err := pki.GenerateKey()
		if err != nil {
			return nil, nil, "", err
		}
		b, err := pki.MarshalPrivateKeyPEM(key)
		if err != nil {
			return nil, nil, "", err
		}
		return key, b, identity.KeyKindFile, nil
	}
	key, rec, err := k.TPM.NewNodeKey(ctx)
	if err != nil {
		return nil, nil, "", fmt.Errorf("make the node key in the TPM: %w", err)
	}
	b, err := tpm.MarshalKeyRecord(rec)
	if err != nil {
		key.Close()
		return nil, nil, "", err
	}
	return key, b, identity.KeyKindTPM, nil
}

// Loader is the identity.KeyLoader for this host: file keys as they are,
// TPM records derived in the TPM. A TPM that derives another key than the
// record's (a cleared owner hierarchy) yields that other key, so LoadState
// reports the mismatch with the "was the TPM cleared?" hint.
func (k Keys) Loader(ctx context.Context) identity.KeyLoader {
	return func(b []byte) (crypto.Signer, error) {
		block, _ := pem.Decode(b)
		if block == nil || block.Type != tpm.KeyRecordPEMType {
			return identity.LoadPKCS8Key(b)
		}
		rec, err := tpm.ParseKeyRecord(b)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", identity.ErrInvalidKey, err)
		}
		if k.TPM == nil {
			return nil, errors.New("node.key is held in a TPM, but this bcd has none (tpm = \"off\", or no TPM found): set tpm in config.toml")
		}
		key, err := k.TPM.LoadNodeKey(ctx, rec)
		if errors.Is(err, tpm.ErrKeyChanged) {
			rec.Name = nil
			key, err = k.TPM.LoadNodeKey(ctx, rec)
		}
		if err != nil {
			return nil, fmt.Errorf("derive the node key in the TPM: %w", err)
		}
		return key, nil
	}
}

// OpenTPM opens the TPM named by a config's tpm setting ("auto", "off", a
// device path or tcp://host:port) or, when helperSocket is set, connects
// to bcd helper instead (the unprivileged node never opens the device).
// No TPM is (nil, nil, nil) unless required. With spec "auto", a TPM this
// user may not open (not root, not in the tss group) is no TPM either, and
// warn says so: file keys are used. close releases what was opened.
func OpenTPM(spec, helperSocket string, required bool, warn func(string)) (t tpmhelper.TPM, close func(), err error) {
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
	return tpmhelper.Direct(d), func() { d.Close() }, nil
}
