package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nodetrust/nodetrust/tpm"
)

// TPM is what the node does with a TPM: node keys, the AK, and the tpm
// attestor's evidence. [Direct] implements it on a TPM this process opened;
// bcd helper's client (internal/bcd/tpmhelper.Client) implements it for an
// unprivileged node that never opens the TPM itself. The agent takes either.
type TPM interface {
	// NewNodeKey makes a new node key; store the record to load it later.
	NewNodeKey(ctx context.Context) (tpm.NodeKey, tpm.KeyRecord, error)
	// LoadNodeKey derives the node key of rec again; the error wraps
	// tpm.ErrKeyChanged when the TPM derives another key than rec names.
	LoadNodeKey(ctx context.Context, rec tpm.KeyRecord) (tpm.NodeKey, error)
	// NewAK makes a new AK.
	NewAK(ctx context.Context) (tpm.AttestationKey, tpm.KeyRecord, error)
	// LoadAK derives the AK of rec again.
	LoadAK(ctx context.Context, rec tpm.KeyRecord) (tpm.AttestationKey, error)
	// Certify has ak certify key (TPM2_Certify) over qualifyingData; both
	// must come from this TPM.
	Certify(ctx context.Context, ak tpm.AttestationKey, key tpm.NodeKey, qualifyingData []byte) (attest, signature []byte, err error)
	// EKCertificates returns the EK certificates, keyed by NV index.
	EKCertificates(ctx context.Context) (map[uint32][]byte, error)
	// EK returns the public part of the EK of kind.
	EK(ctx context.Context, kind tpm.EKKind) (*tpm.EK, error)
	// ActivateCredential recovers the secret sealed to ek and ak's name.
	ActivateCredential(ctx context.Context, ak tpm.AttestationKey, ek *tpm.EK, credentialBlob, encryptedSecret []byte) ([]byte, error)
	// Quote has ak quote pcrs of the SHA-256 bank over nonce.
	Quote(ctx context.Context, ak tpm.AttestationKey, nonce []byte, pcrs []int) (quoted, signature []byte, values map[int][]byte, err error)
}

// Direct returns t as a [TPM], for a process that may open the TPM itself
// (bcd join as root, bcd node without [helper], bcd helper). Its keys are
// *tpm.Key and *tpm.AK.
func Direct(t *tpm.TPM) TPM { return &direct{t: t, eks: map[tpm.EKKind]*tpm.EK{}} }

type direct struct {
	t   *tpm.TPM
	mu  sync.Mutex
	eks map[tpm.EKKind]*tpm.EK // guarded by mu
}

func (d *direct) NewNodeKey(ctx context.Context) (tpm.NodeKey, tpm.KeyRecord, error) {
	k, rec, err := d.t.NewNodeKey(ctx)
	if err != nil {
		return nil, tpm.KeyRecord{}, err
	}
	return k, rec, nil
}

func (d *direct) LoadNodeKey(ctx context.Context, rec tpm.KeyRecord) (tpm.NodeKey, error) {
	k, err := d.t.LoadNodeKey(ctx, rec)
	if err != nil {
		return nil, err
	}
	return k, nil
}

func (d *direct) NewAK(ctx context.Context) (tpm.AttestationKey, tpm.KeyRecord, error) {
	k, rec, err := d.t.NewAK(ctx)
	if err != nil {
		return nil, tpm.KeyRecord{}, err
	}
	return k, rec, nil
}

func (d *direct) LoadAK(ctx context.Context, rec tpm.KeyRecord) (tpm.AttestationKey, error) {
	k, err := d.t.LoadAK(ctx, rec)
	if err != nil {
		return nil, err
	}
	return k, nil
}

func directAK(ak tpm.AttestationKey) (*tpm.AK, error) {
	a, ok := ak.(*tpm.AK)
	if !ok || a == nil {
		return nil, errors.New("tpm: the AK is not held by this TPM connection")
	}
	return a, nil
}

func (d *direct) Certify(ctx context.Context, ak tpm.AttestationKey, key tpm.NodeKey, qualifyingData []byte) ([]byte, []byte, error) {
	a, err := directAK(ak)
	if err != nil {
		return nil, nil, err
	}
	k, ok := key.(*tpm.Key)
	if !ok || k == nil {
		return nil, nil, errors.New("tpm: the key is not held by this TPM connection")
	}
	return d.t.Certify(ctx, a, k, qualifyingData)
}

func (d *direct) EKCertificates(ctx context.Context) (map[uint32][]byte, error) {
	return d.t.EKCertificates(ctx)
}

func (d *direct) EK(ctx context.Context, kind tpm.EKKind) (*tpm.EK, error) {
	ek, err := d.t.EK(ctx, kind)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.eks[ek.Kind] = ek
	d.mu.Unlock()
	c := *ek
	return &c, nil
}

func (d *direct) ActivateCredential(ctx context.Context, ak tpm.AttestationKey, ek *tpm.EK, credentialBlob, encryptedSecret []byte) ([]byte, error) {
	a, err := directAK(ak)
	if err != nil {
		return nil, err
	}
	if ek == nil {
		return nil, errors.New("ActivateCredential: want an EK from EK")
	}
	d.mu.Lock()
	tek := d.eks[ek.Kind]
	d.mu.Unlock()
	if tek == nil || !bytes.Equal(tek.Name, ek.Name) {
		if tek, err = d.t.EK(ctx, ek.Kind); err != nil {
			return nil, err
		}
		if !bytes.Equal(tek.Name, ek.Name) {
			return nil, fmt.Errorf("the TPM derives the %s EK %x, not %x: %w", ek.Kind, tek.Name, ek.Name, tpm.ErrEKChanged)
		}
	}
	return d.t.ActivateCredential(ctx, a, tek, credentialBlob, encryptedSecret)
}

func (d *direct) Quote(ctx context.Context, ak tpm.AttestationKey, nonce []byte, pcrs []int) ([]byte, []byte, map[int][]byte, error) {
	a, err := directAK(ak)
	if err != nil {
		return nil, nil, nil, err
	}
	return d.t.Quote(ctx, a, nonce, pcrs)
}
