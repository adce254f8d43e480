package agent

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/tpm"
)

// tpmJoin is the tpm attestor's side of a join: the EK, the AK — made for
// this identity, or the LAK an intake certified — and the AK's
// certification of the node key.
type tpmJoin struct {
	t  TPM
	ek *tpm.EK
	ak tpm.AttestationKey
	// lak, when set, is the installed node's LAK: the join derives that
	// AK again instead of making one, and sends its certificate.
	lak *installedLAK
	// now is the node's clock, for the LAK certificate's expiry.
	now func() time.Time
	// eventLog is the boot's measurement log, or nil where the TPM has
	// none (swtpm, the simulator).
	eventLog []byte
}

// evidence reads the EK certificates (and the chain stored in NV) and the
// EK its certificate certifies, makes the AK (or derives the LAK again,
// checking its certificate certifies it), and has it certify the node key
// over sha256(csr).
func (j *tpmJoin) evidence(ctx context.Context, key crypto.Signer, csrHash []byte) (*joinv1.TpmEvidence, error) {
	nodeKey, ok := key.(tpm.NodeKey)
	if !ok {
		return nil, errors.New("the tpm attestor needs the node key in the TPM")
	}
	certs, err := j.t.EKCertificates(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the EK certificates: %w", err)
	}
	if j.ek, err = j.t.EK(ctx, tpm.EKAuto); err != nil {
		return nil, fmt.Errorf("derive the EK: %w", err)
	}
	var lakChain [][]byte
	if j.lak != nil {
		if j.ak, err = j.t.LoadAK(ctx, j.lak.rec); err != nil {
			return nil, fmt.Errorf("load the LAK from the TPM (is this the TPM of the intake?): %w", err)
		}
		if err := j.lak.check(j.ak); err != nil {
			return nil, err
		}
		now := time.Now
		if j.now != nil {
			now = j.now
		}
		lakChain = j.lak.wire(now())
	} else if j.ak, _, err = j.t.NewAK(ctx); err != nil {
		return nil, fmt.Errorf("make the AK: %w", err)
	}
	attest, sig, err := j.t.Certify(ctx, j.ak, nodeKey, csrHash)
	if err != nil {
		return nil, fmt.Errorf("certify the node key with the AK: %w", err)
	}
	idx := j.ek.Kind.CertIndex()
	// The chain a manufacturer stored in NV lets the server build the path
	// through vendor intermediates. A chain index that does not split into
	// DER certificates is left out: the EK may still be pinned, and the
	// server refuses an untrusted certificate anyway.
	chain, err := tpm.SplitEKChain(certs)
	if err != nil {
		chain = nil
	}
	return &joinv1.TpmEvidence{
		EkCertificate:      certs[idx],
		EkCertificateIndex: idx,
		EkChain:            chain,
		EkPublic:           j.ek.PublicArea,
		AkPublic:           j.ak.PublicArea(),
		NodeKeyPublic:      nodeKey.PublicArea(),
		CertifyAttest:      attest,
		CertifySignature:   sig,
		LakChain:           lakChain,
	}, nil
}

// answer activates the challenge's credential with the EK and quotes the
// boot PCRs over its nonce.
func (j *tpmJoin) answer(ctx context.Context, ch *joinv1.JoinChallenge) (*joinv1.ChallengeAnswer, error) {
	secret, err := j.t.ActivateCredential(ctx, j.ak, j.ek, ch.CredentialBlob, ch.EncryptedSecret)
	if err != nil {
		return nil, fmt.Errorf("activate the credential: %w", err)
	}
	quoted, sig, values, err := j.t.Quote(ctx, j.ak, ch.Nonce, tpm.BootPCRs)
	if err != nil {
		return nil, fmt.Errorf("quote the boot PCRs: %w", err)
	}
	pcrs := make(map[uint32][]byte, len(values))
	for i, v := range values {
		pcrs[uint32(i)] = v
	}
	return &joinv1.ChallengeAnswer{
		Round:           ch.Round,
		ActivatedSecret: secret,
		QuoteAttest:     quoted,
		QuoteSignature:  sig,
		Pcrs:            pcrs,
		EventLog:        j.eventLog,
	}, nil
}

func (j *tpmJoin) close() {
	if j.ak != nil {
		j.ak.Close()
	}
}
