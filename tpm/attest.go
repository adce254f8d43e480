package tpm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// ActivateCredential recovers the secret a verifier sealed to ek and ak's
// name with MakeCredential (Part 1, section 24 "Credential Protection"): it
// derives ek again, authorizes it, and runs TPM2_ActivateCredential (Part 3,
// section 12.5). The TPM releases the secret only when ak's name is the one
// the credential names and ek decrypts the seed, which proves to the
// verifier that ak sits in the TPM that holds ek.
//
// credentialBlob is the contents of a TPM2B_ID_OBJECT and encryptedSecret the
// contents of a TPM2B_ENCRYPTED_SECRET, both without their 2-byte size, as
// go-tpm's tpm2.CreateCredential returns them (go-attestation's
// EncryptedCredential carries the size: drop its first two bytes).
//
// A low-range EK (RSA 2048, ECC P-256; userWithAuth clear) is authorized by a
// policy session satisfying its authPolicy, PolicySecret(TPM_RH_ENDORSEMENT)
// (Part 3, section 23.4) with the endorsement hierarchy's empty authValue.
// The high-range P-384 EK has userWithAuth set and is authorized by its empty
// authValue. The EK and the session are flushed on every path. ek must come
// from [TPM.EK]; when the TPM now derives another EK, the error wraps
// [ErrEKChanged].
func (t *TPM) ActivateCredential(ctx context.Context, ak *AK, ek *EK, credentialBlob, encryptedSecret []byte) (secret []byte, err error) {
	if ak == nil || ek == nil || len(ek.template) == 0 {
		return nil, errors.New("ActivateCredential: want an AK and an EK from (*TPM).EK")
	}
	tr, err := t.use(ctx, ak.o)
	if err != nil {
		return nil, err
	}
	defer t.mu.Unlock()

	what := "the " + ek.Kind.String() + " EK"
	lo, err := t.createPrimary(tr, tpm2.TPMRHEndorsement, ek.template, what)
	if err != nil {
		return nil, err
	}
	defer func() {
		if ferr := t.flush(lo.handle, what); ferr != nil {
			secret, err = nil, errors.Join(err, ferr)
		}
	}()
	if !bytes.Equal(lo.name, ek.Name) {
		return nil, fmt.Errorf("TPM2_CreatePrimary for %s: name %x, want %x: %w", what, lo.name, ek.Name, ErrEKChanged)
	}
	tmpl, err := parsePublicArea(ek.template)
	if err != nil {
		return nil, fmt.Errorf("EK template: %w", err)
	}

	ekAuth := tpm2.PasswordAuth(nil)
	if !tmpl.ObjectAttributes.UserWithAuth {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// The session is started and flushed on the raw transport, so that
		// a cancelled context cannot leave it loaded.
		sess, closeSess, err := tpm2.PolicySession(rawTransport{t.tr}, tmpl.NameAlg, 16)
		if err != nil {
			return nil, fmt.Errorf("TPM2_StartAuthSession for the EK policy: %w", err)
		}
		defer func() {
			if ferr := closeSess(); ferr != nil {
				secret, err = nil, errors.Join(err, fmt.Errorf("TPM2_FlushContext for the EK policy session: %w", ferr))
			}
		}()
		if _, err := (tpm2.PolicySecret{
			AuthHandle:    tpm2.AuthHandle{Handle: tpm2.TPMRHEndorsement, Auth: tpm2.PasswordAuth(nil)},
			PolicySession: sess.Handle(),
			NonceTPM:      sess.NonceTPM(),
		}).Execute(tr); err != nil {
			return nil, fmt.Errorf("TPM2_PolicySecret for %s: %w", what, err)
		}
		ekAuth = sess
	}

	rsp, err := tpm2.ActivateCredential{
		ActivateHandle: tpm2.AuthHandle{Handle: ak.o.handle, Name: tpm2.TPM2BName{Buffer: ak.o.name}, Auth: tpm2.PasswordAuth(nil)},
		KeyHandle:      tpm2.AuthHandle{Handle: lo.handle, Name: tpm2.TPM2BName{Buffer: lo.name}, Auth: ekAuth},
		CredentialBlob: tpm2.TPM2BIDObject{Buffer: credentialBlob},
		Secret:         tpm2.TPM2BEncryptedSecret{Buffer: encryptedSecret},
	}.Execute(tr)
	if err != nil {
		return nil, fmt.Errorf("TPM2_ActivateCredential with %s: %w", what, err)
	}
	return bytes.Clone(rsp.CertInfo.Buffer), nil
}

// BootPCRs are the PCRs a boot quote covers: 0–7, the firmware's and boot
// loader's measurements (TCG PC Client Platform Firmware Profile, section
// 3.3.4).
var BootPCRs = []int{0, 1, 2, 3, 4, 5, 6, 7}

// Quote signs the SHA-256 bank's values of pcrs and nonce with ak, using
// TPM2_Quote (Part 3, section 18.4). It returns quoted, the TPMS_ATTEST
// (Part 2, section 10.12.12; the contents of a TPM2B_ATTEST) whose extraData
// is nonce, the AK's signature over it as a marshalled TPMT_SIGNATURE (Part
// 2, section 11.3.4), and the PCR values read with TPM2_PCR_Read (Part 3,
// section 22.4).
//
// Quote reads the PCRs before quoting and repeats both, up to three times,
// when the quote's pcrDigest does not match the values (a PCR was extended
// in between), so that the values it returns are the quoted ones. It checks
// nothing else: verifying the quote is the verifier's job.
func (t *TPM) Quote(ctx context.Context, ak *AK, nonce []byte, pcrs []int) (quoted, signature []byte, values map[int][]byte, err error) {
	if ak == nil {
		return nil, nil, nil, errors.New("TPM2_Quote: want an AK")
	}
	sel, sorted, err := sha256Selection(pcrs)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("TPM2_Quote: %w", err)
	}
	tr, err := t.use(ctx, ak.o)
	if err != nil {
		return nil, nil, nil, err
	}
	defer t.mu.Unlock()
	for range 3 {
		values, err = pcrRead(tr, sorted)
		if err != nil {
			return nil, nil, nil, err
		}
		rsp, err := tpm2.Quote{
			SignHandle:     tpm2.AuthHandle{Handle: ak.o.handle, Name: tpm2.TPM2BName{Buffer: ak.o.name}, Auth: tpm2.PasswordAuth(nil)},
			QualifyingData: tpm2.TPM2BData{Buffer: nonce},
			InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
			PCRSelect:      sel,
		}.Execute(tr)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("TPM2_Quote with the AK: %w", err)
		}
		quoted = bytes.Clone(rsp.Quoted.Bytes())
		attest, err := rsp.Quoted.Contents()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("TPM2_Quote with the AK: quoted: %w", err)
		}
		info, err := attest.Attested.Quote()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("TPM2_Quote with the AK: quoted: %w", err)
		}
		h := sha256.New()
		for _, i := range sorted {
			h.Write(values[i])
		}
		if bytes.Equal(h.Sum(nil), info.PCRDigest.Buffer) {
			return quoted, tpm2.Marshal(rsp.Signature), values, nil
		}
	}
	return nil, nil, nil, errors.New("TPM2_Quote with the AK: the PCRs kept changing while quoting them")
}

// sha256Selection returns the TPML_PCR_SELECTION of pcrs in the SHA-256 bank
// and pcrs sorted.
func sha256Selection(pcrs []int) (tpm2.TPMLPCRSelection, []int, error) {
	if len(pcrs) == 0 {
		return tpm2.TPMLPCRSelection{}, nil, errors.New("no PCR selected")
	}
	for _, p := range pcrs {
		if p < 0 || p > 23 {
			return tpm2.TPMLPCRSelection{}, nil, fmt.Errorf("PCR %d: want 0..23", p)
		}
	}
	sorted := slices.Clone(pcrs)
	slices.Sort(sorted)
	if len(slices.Compact(slices.Clone(sorted))) != len(sorted) {
		return tpm2.TPMLPCRSelection{}, nil, fmt.Errorf("PCR selected twice in %v", pcrs)
	}
	return selectionOf(sorted), sorted, nil
}

func selectionOf(pcrs []int) tpm2.TPMLPCRSelection {
	var u []uint
	for _, p := range pcrs {
		u = append(u, uint(p))
	}
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{
		Hash:      tpm2.TPMAlgSHA256,
		PCRSelect: tpm2.PCClientCompatible.PCRs(u...),
	}}}
}

// pcrRead reads the SHA-256 bank's values of pcrs (sorted, 0–23, checked by
// sha256Selection) with as
// many TPM2_PCR_Read as the TPM needs: one returns at most 8 digests.
func pcrRead(tr transport.TPM, pcrs []int) (map[int][]byte, error) {
	values := make(map[int][]byte, len(pcrs))
	remaining := slices.Clone(pcrs)
	for len(remaining) > 0 {
		rsp, err := tpm2.PCRRead{PCRSelectionIn: selectionOf(remaining)}.Execute(tr)
		if err != nil {
			return nil, fmt.Errorf("TPM2_PCR_Read of PCRs %v: %w", remaining, err)
		}
		var got []int
		for _, s := range rsp.PCRSelectionOut.PCRSelections {
			if s.Hash != tpm2.TPMAlgSHA256 {
				continue
			}
			for i, b := range s.PCRSelect {
				for bit := range 8 {
					if b&(1<<bit) != 0 {
						got = append(got, i*8+bit)
					}
				}
			}
		}
		if len(got) == 0 || len(got) != len(rsp.PCRValues.Digests) {
			return nil, fmt.Errorf("TPM2_PCR_Read of PCRs %v: %d values for %d PCRs (is the SHA-256 bank active?)", remaining, len(rsp.PCRValues.Digests), len(got))
		}
		for i, p := range got {
			if !slices.Contains(remaining, p) {
				return nil, fmt.Errorf("TPM2_PCR_Read of PCRs %v: answered PCR %d", remaining, p)
			}
			values[p] = bytes.Clone(rsp.PCRValues.Digests[i].Buffer)
		}
		remaining = slices.DeleteFunc(remaining, func(p int) bool { _, ok := values[p]; return ok })
	}
	return values, nil
}

// Certify has ak certify key with TPM2_Certify (Part 3, section 18.2): the
// TPM signs that it holds an object of key's name, with qualifyingData (the
// node sends sha256(csr)) as extraData. It returns attest, the TPMS_ATTEST
// (contents of a TPM2B_ATTEST) of type TPM_ST_ATTEST_CERTIFY, and the AK's
// signature over it as a marshalled TPMT_SIGNATURE. ak and key must be
// loaded in this TPM connection.
func (t *TPM) Certify(ctx context.Context, ak *AK, key *Key, qualifyingData []byte) (attest, signature []byte, err error) {
	if ak == nil || key == nil {
		return nil, nil, errors.New("TPM2_Certify: want an AK and a key")
	}
	tr, err := t.use(ctx, ak.o, key.o)
	if err != nil {
		return nil, nil, err
	}
	defer t.mu.Unlock()
	rsp, err := tpm2.Certify{
		ObjectHandle:   tpm2.AuthHandle{Handle: key.o.handle, Name: tpm2.TPM2BName{Buffer: key.o.name}, Auth: tpm2.PasswordAuth(nil)},
		SignHandle:     tpm2.AuthHandle{Handle: ak.o.handle, Name: tpm2.TPM2BName{Buffer: ak.o.name}, Auth: tpm2.PasswordAuth(nil)},
		QualifyingData: tpm2.TPM2BData{Buffer: qualifyingData},
		InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
	}.Execute(tr)
	if err != nil {
		return nil, nil, fmt.Errorf("TPM2_Certify of the node key by the AK: %w", err)
	}
	return bytes.Clone(rsp.CertifyInfo.Bytes()), tpm2.Marshal(rsp.Signature), nil
}
