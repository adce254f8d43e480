package agent

import (
	"context"
	"crypto"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
)

// Keys makes and loads node keys: in the TPM when there is one, else as
// PKCS#8 files. The same signatures come out either way.
type Keys struct {
	// TPM is the host's TPM (directly, or through bcd helper), or nil for
	// file keys.
	TPM TPM
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
