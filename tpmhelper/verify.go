package tpmhelper

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
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
	if err := verifySignature(ak, attest, signature); err != nil {
		return nil, fmt.Errorf("%w: %w", signer, err)
	}
	a, err := parseStrict[tpm2.TPMSAttest](attest, "TPMS_ATTEST")
	if err != nil {
		return nil, err
	}
	if a.Magic != tpm2.TPMGeneratedValue {
		return nil, fmt.Errorf("TPMS_ATTEST magic %#x, want TPM_GENERATED_VALUE", uint32(a.Magic))
	}
	if a.Type != typ {
		return nil, fmt.Errorf("TPMS_ATTEST of type %#x, want %#x", uint16(a.Type), uint16(typ))
	}
	return a, nil
}

// verifySignature checks that sig, a marshalled TPMT_SIGNATURE (Part 2,
// section 11.3.4), is an ECDSA/SHA-256 signature by ak over SHA-256(msg).
func verifySignature(ak *ecdsa.PublicKey, msg, sig []byte) error {
	s, err := parseStrict[tpm2.TPMTSignature](sig, "TPMT_SIGNATURE")
	if err != nil {
		return err
	}
	if s.SigAlg != tpm2.TPMAlgECDSA {
		return fmt.Errorf("signature algorithm %#x, want ECDSA", uint16(s.SigAlg))
	}
	e, err := s.Signature.ECDSA()
	if err != nil {
		return fmt.Errorf("ECDSA signature: %w", err)
	}
	if e.Hash != tpm2.TPMAlgSHA256 {
		return fmt.Errorf("signature hash %#x, want SHA-256", uint16(e.Hash))
	}
	if n, m := len(e.SignatureR.Buffer), len(e.SignatureS.Buffer); n == 0 || m == 0 || n > 32 || m > 32 {
		return fmt.Errorf("ECDSA signature with r of %d and s of %d bytes", n, m)
	}
	digest := sha256.Sum256(msg)
	if !ecdsa.Verify(ak, digest[:], new(big.Int).SetBytes(e.SignatureR.Buffer), new(big.Int).SetBytes(e.SignatureS.Buffer)) {
		return errors.New("the signature does not verify with the AK")
	}
	return nil
}

// parseStrict unmarshals b as a T, which must marshal back to exactly b.
func parseStrict[T tpm2.Marshallable, P interface {
	*T
	tpm2.Unmarshallable
}](b []byte, what string) (v *T, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("malformed %s: %v", what, r)
		}
	}()
	if len(b) == 0 {
		return nil, fmt.Errorf("empty %s", what)
	}
	v, err = tpm2.Unmarshal[T, P](b)
	if err != nil {
		return nil, fmt.Errorf("malformed %s: %w", what, err)
	}
	if !bytes.Equal(tpm2.Marshal(*v), b) {
		return nil, fmt.Errorf("malformed %s: trailing or non-canonical data", what)
	}
	return v, nil
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
	var key crypto.PublicKey
	switch kind {
	case tpm.EKRSA2048:
		if pub.Type != tpm2.TPMAlgRSA {
			return nil, nil, fmt.Errorf("EK of type %#x, want RSA", uint16(pub.Type))
		}
		parms, err := pub.Parameters.RSADetail()
		if err != nil {
			return nil, nil, err
		}
		n, err := pub.Unique.RSA()
		if err != nil {
			return nil, nil, err
		}
		k, err := tpm2.RSAPub(parms, n)
		if err != nil {
			return nil, nil, err
		}
		if k.N.BitLen() != 2048 {
			return nil, nil, fmt.Errorf("RSA EK of %d bits, want 2048", k.N.BitLen())
		}
		key = k
	case tpm.EKECCP256, tpm.EKECCP384:
		if pub.Type != tpm2.TPMAlgECC {
			return nil, nil, fmt.Errorf("EK of type %#x, want ECC", uint16(pub.Type))
		}
		parms, err := pub.Parameters.ECCDetail()
		if err != nil {
			return nil, nil, err
		}
		curve, id := elliptic.P256(), tpm2.TPMECCNistP256
		if kind == tpm.EKECCP384 {
			curve, id = elliptic.P384(), tpm2.TPMECCNistP384
		}
		if parms.CurveID != id {
			return nil, nil, fmt.Errorf("EK on curve %#x, want %#x", uint16(parms.CurveID), uint16(id))
		}
		point, err := pub.Unique.ECC()
		if err != nil {
			return nil, nil, err
		}
		k, err := tpmpub.ECPoint(curve, point.X.Buffer, point.Y.Buffer)
		if err != nil {
			return nil, nil, err
		}
		key = k
	default:
		return nil, nil, fmt.Errorf("EK of kind %s", kind)
	}
	name, err := tpmpub.Name(publicArea)
	if err != nil {
		return nil, nil, err
	}
	return key, name, nil
}
