package tpmhelper

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// The client's checks of the helper's answers. Every byte they look at is
// untrusted: parsing is strict and a panic in go-tpm's unmarshalling is an
// error.

var (
	errNotNodeKeySignature = errors.New("the helper's signature is not the node key's")
	errCertifiedOtherAK    = errors.New("the helper certified with another AK")
	errCertifiedOtherKey   = errors.New("the helper certified another key")
	errQuotedOtherAK       = errors.New("the helper quoted with another AK")
)

// keyData is what the client knows of a key the helper derived, all of it
// checked or computed by the client.
type keyData struct {
	rec        tpm.KeyRecord // names the key
	unique     []byte
	publicArea []byte
	name       []byte // computed from publicArea
	pub        *ecdsa.PublicKey
}

// checkDerived checks the answer to tpm.nodekey or tpm.ak for asked, a
// record of kind: the public area has exactly the attributes of kind, the
// record is asked's, and the names are the one computed here from the
// public area (and asked's, when it names a key).
func checkDerived(op string, asked tpm.KeyRecord, resp *response) (*keyData, error) {
	var (
		pub *ecdsa.PublicKey
		err error
	)
	switch asked.Kind {
	case tpm.KindNodeKey:
		if pub, err = tpmpub.CheckNodeKey(resp.PublicArea); err != nil {
			return nil, untrusted(op, fmt.Errorf("the helper's key is not a node key: %w", err))
		}
	case tpm.KindAK:
		if pub, err = tpmpub.CheckAK(resp.PublicArea); err != nil {
			return nil, untrusted(op, fmt.Errorf("the helper's AK is not an AK: %w", err))
		}
	default:
		return nil, fmt.Errorf("%s: a record of kind %s", op, asked.Kind)
	}
	got, err := tpm.ParseKeyRecord(resp.Record)
	if err != nil {
		return nil, untrusted(op, fmt.Errorf("the helper's record: %w", err))
	}
	if got.Kind != asked.Kind || got.Hierarchy != asked.Hierarchy || !bytes.Equal(got.Template, asked.Template) {
		return nil, untrusted(op, errors.New("the helper answered with another record than the node's"))
	}
	name, err := tpmpub.Name(resp.PublicArea) // strict, and SHA-256 names per CheckNodeKey/CheckAK
	if err != nil {
		return nil, untrusted(op, err)
	}
	if !bytes.Equal(resp.Name, name) || !bytes.Equal(got.Name, name) {
		return nil, untrusted(op, fmt.Errorf("the helper names the key %x, its public area is %x's", resp.Name, name))
	}
	if len(asked.Name) != 0 && !bytes.Equal(asked.Name, name) {
		return nil, untrusted(op, fmt.Errorf("the record names key %x, the helper answered with %x", asked.Name, name))
	}
	rec := asked
	rec.Name = name
	return &keyData{rec: rec, unique: asked.Unique(), publicArea: bytes.Clone(resp.PublicArea), name: name, pub: pub}, nil
}

// checkCertify checks a TPM2_Certify answer (Part 3, section 18.2): signed
// by ak, a TPM_ST_ATTEST_CERTIFY the TPM generated, over qualifyingData,
// naming keyName.
func checkCertify(ak *ecdsa.PublicKey, keyName, qualifyingData, attest, signature []byte) error {
	a, err := checkAttest(ak, attest, signature, tpm2.TPMSTAttestCertify, errCertifiedOtherAK)
	if err != nil {
		return err
	}
	if !bytes.Equal(a.ExtraData.Buffer, qualifyingData) {
		return errors.New("the certification is over other qualifying data than the node's")
	}
	info, err := a.Attested.Certify()
	if err != nil {
		return fmt.Errorf("certify info: %w", err)
	}
	if !bytes.Equal(info.Name.Buffer, keyName) {
		return fmt.Errorf("%w: it names %x, not %x", errCertifiedOtherKey, info.Name.Buffer, keyName)
	}
	return nil
}

// checkQuote checks a TPM2_Quote answer (Part 3, section 18.4): signed by
// ak, a TPM_ST_ATTEST_QUOTE the TPM generated, over nonce, selecting exactly
// pcrs of the SHA-256 bank, with the digest of values.
func checkQuote(ak *ecdsa.PublicKey, nonce []byte, pcrs []int, quoted, signature []byte, values map[int][]byte) error {
	a, err := checkAttest(ak, quoted, signature, tpm2.TPMSTAttestQuote, errQuotedOtherAK)
	if err != nil {
		return err
	}
	if !bytes.Equal(a.ExtraData.Buffer, nonce) {
		return errors.New("the quote is over another nonce than the node's")
	}
	info, err := a.Attested.Quote()
	if err != nil {
		return fmt.Errorf("quote info: %w", err)
	}
	want := slices.Sorted(slices.Values(pcrs))
	sels := info.PCRSelect.PCRSelections
	if len(sels) != 1 || sels[0].Hash != tpm2.TPMAlgSHA256 {
		return errors.New("the quote does not select the SHA-256 bank alone")
	}
	var got []int
	for i, b := range sels[0].PCRSelect {
		for bit := range 8 {
			if b&(1<<bit) != 0 {
				got = append(got, i*8+bit)
			}
		}
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("the quote selects PCRs %v, not %v", got, want)
	}
	if len(values) != len(want) {
		return fmt.Errorf("%d PCR values for %d PCRs", len(values), len(want))
	}
	h := sha256.New()
	for _, p := range want {
		v, ok := values[p]
		if !ok || len(v) != sha256.Size {
			return fmt.Errorf("no SHA-256 value of PCR %d", p)
		}
		h.Write(v)
	}
	if !bytes.Equal(h.Sum(nil), info.PCRDigest.Buffer) {
		return errors.New("the quote's digest is not that of the PCR values the helper returned")
	}
	return nil
}

// checkAttest verifies signature over attest with ak (signer names the
// failure) and parses attest, checking its magic and type.
func checkAttest(ak *ecdsa.PublicKey, attest, signature []byte, typ tpm2.TPMST, signer error) (*tpm2.TPMSAttest, error) {
	if err := tpmpub.VerifySignature(ak, attest, signature); err != nil {
		return nil, fmt.Errorf("%w: %w", signer, err)
	}
	return tpmpub.CheckAttest(attest, typ)
}

// ekPublic checks that publicArea is an EK of kind (type, size or curve, and
// the attributes every EK has: fixedTPM, fixedParent, restricted, decrypt,
// not sign) and returns its public key and name.
func ekPublic(kind tpm.EKKind, publicArea []byte) (crypto.PublicKey, []byte, error) {
	pub, err := tpmpub.Parse(publicArea)
	if err != nil {
		return nil, nil, err
	}
	if a := pub.ObjectAttributes; !a.FixedTPM || !a.FixedParent || !a.Restricted || !a.Decrypt || a.SignEncrypt {
		return nil, nil, fmt.Errorf("EK attributes %#08x: want fixedTPM, fixedParent, restricted and decrypt, not sign", tpmpub.AttributeBits(a))
	}
	tmpl, err := kind.Template()
	if err != nil {
		return nil, nil, fmt.Errorf("EK of kind %s", kind)
	}
	key, err := tpmpub.EKPublicKey(pub, tmpl)
	if err != nil {
		return nil, nil, err
	}
	name, err := tpmpub.Name(publicArea)
	if err != nil {
		return nil, nil, err
	}
	return key, name, nil
}
