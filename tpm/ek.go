package tpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// NV indices of the EK certificates, from the TCG EK Credential Profile for
// TPM Family 2.0 (version 2.5, section 2.2.1.4 "Low Range" and 2.2.1.5 "High
// Range"). Each certifies the EK the TPM derives with its template (section
// B.3 for the low range, B.4 for the high range): the same key type under
// another template is another key.
const (
	EKCertIndexRSA2048     uint32 = 0x01C00002 // template L-1
	EKCertIndexECCP256     uint32 = 0x01C0000A // template L-2
	EKCertIndexRSA2048High uint32 = 0x01C00012 // template H-1
	EKCertIndexECCP256High uint32 = 0x01C00014 // template H-2
	EKCertIndexECCP384     uint32 = 0x01C00016 // template H-3
	EKCertIndexECCP521     uint32 = 0x01C00018 // template H-4
	EKCertIndexRSA3072     uint32 = 0x01C0001C // template H-6
	EKCertIndexRSA4096     uint32 = 0x01C0001E // template H-7
)

// The EK certificate chain indices (EK Credential Profile 2.5, section
// 2.2.1.5.2): a manufacturer may store the intermediate CA certificates
// between the EK certificate and its root there, one or more DER
// certificates per index, from the first index on. [TPM.EKCertificates]
// reads at most [MaxEKChainIndices] of them.
const (
	EKChainIndexFirst uint32 = 0x01C00100
	EKChainIndexLast  uint32 = 0x01C001FF
	// MaxEKChainIndices bounds how many chain indices are read.
	MaxEKChainIndices = 8
	// MaxEKChainCertificates bounds how many certificates a chain yields.
	MaxEKChainCertificates = 8
)

// IsEKChainIndex reports whether idx is one of the EK certificate chain
// indices.
func IsEKChainIndex(idx uint32) bool { return idx >= EKChainIndexFirst && idx <= EKChainIndexLast }

// EKKind names one of the EK templates of the TCG EK Credential Profile.
// ECC SM2 P-256 (H-5) is not supported: Go's standard library has no SM2.
type EKKind int

const (
	// EKAuto picks the EK whose certificate the TPM holds (see [TPM.EK]).
	EKAuto EKKind = iota
	// EKRSA2048 is template L-1: RSA 2048, SHA-256 names, AES-128-CFB.
	EKRSA2048
	// EKECCP256 is template L-2: ECC NIST P-256, SHA-256 names, AES-128-CFB.
	EKECCP256
	// EKECCP384 is template H-3: ECC NIST P-384, SHA-384 names,
	// AES-256-CFB, userWithAuth (the one swtpm_setup certifies).
	EKECCP384
	// EKRSA2048High is template H-1: RSA 2048, SHA-256 names,
	// AES-128-CFB, PolicyB, userWithAuth, an empty unique field.
	EKRSA2048High
	// EKECCP256High is template H-2: ECC NIST P-256, SHA-256 names,
	// AES-128-CFB, PolicyB, userWithAuth, an empty unique field.
	EKECCP256High
	// EKECCP521 is template H-4: ECC NIST P-521, SHA-512 names,
	// AES-256-CFB.
	EKECCP521
	// EKRSA3072 is template H-6: RSA 3072, SHA-384 names, AES-256-CFB.
	EKRSA3072
	// EKRSA4096 is template H-7: RSA 4096, SHA-384 names, AES-256-CFB.
	EKRSA4096
)

// ekKinds lists the concrete kinds in EKAuto's order of preference: the
// low range first (what most TPMs ship), then the high range.
var ekKinds = []EKKind{EKRSA2048, EKECCP256, EKRSA2048High, EKECCP256High, EKECCP384, EKRSA3072, EKECCP521, EKRSA4096}

// EKKinds returns the concrete kinds, in the order [TPM.EK] prefers them.
func EKKinds() []EKKind { return slices.Clone(ekKinds) }

func (k EKKind) String() string {
	switch k {
	case EKAuto:
		return "auto"
	case EKRSA2048:
		return "RSA 2048"
	case EKECCP256:
		return "ECC P-256"
	case EKECCP384:
		return "ECC P-384"
	case EKRSA2048High:
		return "RSA 2048 (high range)"
	case EKECCP256High:
		return "ECC P-256 (high range)"
	case EKECCP521:
		return "ECC P-521"
	case EKRSA3072:
		return "RSA 3072"
	case EKRSA4096:
		return "RSA 4096"
	default:
		return fmt.Sprintf("EKKind(%d)", int(k))
	}
}

// CertIndex returns the NV index of the kind's EK certificate, or 0 for
// EKAuto.
func (k EKKind) CertIndex() uint32 {
	switch k {
	case EKRSA2048:
		return EKCertIndexRSA2048
	case EKECCP256:
		return EKCertIndexECCP256
	case EKECCP384:
		return EKCertIndexECCP384
	case EKRSA2048High:
		return EKCertIndexRSA2048High
	case EKECCP256High:
		return EKCertIndexECCP256High
	case EKECCP521:
		return EKCertIndexECCP521
	case EKRSA3072:
		return EKCertIndexRSA3072
	case EKRSA4096:
		return EKCertIndexRSA4096
	default:
		return 0
	}
}

// EKKindOfIndex returns the kind whose certificate sits at idx, or EKAuto
// and false when idx is no EK certificate index.
func EKKindOfIndex(idx uint32) (EKKind, bool) {
	for _, k := range ekKinds {
		if k.CertIndex() == idx {
			return k, true
		}
	}
	return EKAuto, false
}

// Template returns the kind's default template (EK Credential Profile,
// section B.3); EKAuto has none.
func (k EKKind) Template() (tpm2.TPMTPublic, error) { return ekTemplate(k) }

// policyBSHA256 is PolicyB of the EK Credential Profile (section B.6.3):
// PolicyOR(PolicyA = PolicySecret(TPM_RH_ENDORSEMENT), PolicyC), SHA-256.
var policyBSHA256 = []byte{
	0xCA, 0x3D, 0x0A, 0x99, 0xA2, 0xB9, 0x39, 0x06, 0xF7, 0xA3, 0x34, 0x24,
	0x14, 0xEF, 0xCF, 0xB3, 0xA3, 0x85, 0xD4, 0x4C, 0xD1, 0xFD, 0x45, 0x90,
	0x89, 0xD1, 0x9B, 0x50, 0x71, 0xC0, 0xB7, 0xA0,
}

// policyBSHA512 is PolicyB of the EK Credential Profile (section B.6.5),
// SHA-512.
var policyBSHA512 = []byte{
	0xB8, 0x22, 0x1C, 0xA6, 0x9E, 0x85, 0x50, 0xA4, 0x91, 0x4D, 0xE3, 0xFA,
	0xA6, 0xA1, 0x8C, 0x07, 0x2C, 0xC0, 0x12, 0x08, 0x07, 0x3A, 0x92, 0x8D,
	0x5D, 0x66, 0xD5, 0x9E, 0xF7, 0x9E, 0x49, 0xA4, 0x29, 0xC4, 0x1A, 0x6B,
	0x26, 0x95, 0x71, 0xD5, 0x7E, 0xDB, 0x25, 0xFB, 0xDB, 0x18, 0x38, 0x42,
	0x56, 0x08, 0xB4, 0x13, 0xCD, 0x61, 0x6A, 0x5F, 0x6D, 0xB5, 0xB6, 0x07,
	0x1A, 0xF9, 0x9B, 0xEA,
}

// policyBSHA384 is PolicyB of the EK Credential Profile (section B.6.4):
// PolicyOR(PolicyA = PolicySecret(TPM_RH_ENDORSEMENT), PolicyC), SHA-384.
var policyBSHA384 = []byte{
	0xB2, 0x6E, 0x7D, 0x28, 0xD1, 0x1A, 0x50, 0xBC, 0x53, 0xD8, 0x82, 0xBC,
	0xF5, 0xFD, 0x3A, 0x1A, 0x07, 0x41, 0x48, 0xBB, 0x35, 0xD3, 0xB4, 0xE4,
	0xCB, 0x1C, 0x0A, 0xD9, 0xBD, 0xE4, 0x19, 0xCA, 0xCB, 0x47, 0xBA, 0x09,
	0x69, 0x96, 0x46, 0x15, 0x0F, 0x9F, 0xC0, 0x00, 0xF3, 0xF8, 0x0E, 0x12,
}

// highRangeAttributes are the object attributes of every high-range EK
// template (EK Credential Profile, section B.4): unlike the low range,
// userWithAuth is set, so the EK is usable with its empty authValue.
var highRangeAttributes = tpm2.TPMAObject{
	FixedTPM:            true,
	FixedParent:         true,
	SensitiveDataOrigin: true,
	UserWithAuth:        true,
	AdminWithPolicy:     true,
	Restricted:          true,
	Decrypt:             true,
}

func aesCFB(bits int) tpm2.TPMTSymDefObject {
	return tpm2.TPMTSymDefObject{
		Algorithm: tpm2.TPMAlgAES,
		KeyBits:   tpm2.NewTPMUSymKeyBits(tpm2.TPMAlgAES, tpm2.TPMKeyBits(bits)),
		Mode:      tpm2.NewTPMUSymMode(tpm2.TPMAlgAES, tpm2.TPMAlgCFB),
	}
}

// highRSA is a high-range RSA EK template (H-1, H-6, H-7): the unique
// field is empty.
func highRSA(nameAlg tpm2.TPMAlgID, policy []byte, aesBits int, keyBits tpm2.TPMKeyBits) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:             tpm2.TPMAlgRSA,
		NameAlg:          nameAlg,
		ObjectAttributes: highRangeAttributes,
		AuthPolicy:       tpm2.TPM2BDigest{Buffer: policy},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgRSA, &tpm2.TPMSRSAParms{
			Symmetric: aesCFB(aesBits),
			Scheme:    tpm2.TPMTRSAScheme{Scheme: tpm2.TPMAlgNull},
			KeyBits:   keyBits,
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{}),
	}
}

// highECC is a high-range ECC EK template (H-2, H-3, H-4): the unique
// field is empty.
func highECC(nameAlg tpm2.TPMAlgID, policy []byte, aesBits int, curve tpm2.TPMECCCurve) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:             tpm2.TPMAlgECC,
		NameAlg:          nameAlg,
		ObjectAttributes: highRangeAttributes,
		AuthPolicy:       tpm2.TPM2BDigest{Buffer: policy},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: aesCFB(aesBits),
			Scheme:    tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
			CurveID:   curve,
			KDF:       tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{}),
	}
}

// ekTemplate returns the default template of k (EK Credential Profile,
// sections B.3 and B.4). The low-range ones are go-tpm's; their authPolicy
// is PolicySecret(TPM_RH_ENDORSEMENT) and userWithAuth is clear.
func ekTemplate(k EKKind) (tpm2.TPMTPublic, error) {
	switch k {
	case EKRSA2048:
		return tpm2.RSAEKTemplate, nil
	case EKECCP256:
		return tpm2.ECCEKTemplate, nil
	case EKRSA2048High:
		return highRSA(tpm2.TPMAlgSHA256, policyBSHA256, 128, 2048), nil
	case EKECCP256High:
		return highECC(tpm2.TPMAlgSHA256, policyBSHA256, 128, tpm2.TPMECCNistP256), nil
	case EKECCP384:
		return highECC(tpm2.TPMAlgSHA384, policyBSHA384, 256, tpm2.TPMECCNistP384), nil
	case EKECCP521:
		return highECC(tpm2.TPMAlgSHA512, policyBSHA512, 256, tpm2.TPMECCNistP521), nil
	case EKRSA3072:
		return highRSA(tpm2.TPMAlgSHA384, policyBSHA384, 256, 3072), nil
	case EKRSA4096:
		return highRSA(tpm2.TPMAlgSHA384, policyBSHA384, 256, 4096), nil
	default:
		return tpm2.TPMTPublic{}, fmt.Errorf("unknown EK kind %d", int(k))
	}
}

// EK is the public part of an endorsement key the TPM derives. It is not
// kept loaded: [TPM.ActivateCredential] derives it again.
type EK struct {
	Kind EKKind
	// Public is an *rsa.PublicKey or an *ecdsa.PublicKey.
	Public crypto.PublicKey
	// PublicArea is the EK's TPMT_PUBLIC (contents of a TPM2B_PUBLIC), from
	// which a verifier makes a credential (MakeCredential, Part 1, section
	// 24).
	PublicArea []byte
	// Name is the EK's TPM name (Part 1, section 16).
	Name []byte

	template []byte
}

// EK derives the endorsement key of kind with TPM2_CreatePrimary under the
// endorsement hierarchy (Part 3, section 24.1), using the template of the
// TCG EK Credential Profile, and returns its public part; the key itself is
// flushed.
//
// EKAuto picks the EK a certificate of the TPM certifies: it goes through
// the kinds whose certificate index is defined, in [EKKinds]' order, and
// takes the first whose derived key is the certificate's. When no
// certificate matches (or none parses) it takes the first kind with a
// certificate, and a verifier comparing the two sees the difference. A TPM
// with no EK certificate gets RSA 2048 when it implements RSA, else ECC
// P-256 (an ECC-only TPM).
//
// A TPM whose EK certificate was made with a vendor template or an EK nonce
// (NV indices 0x01C00003/4, 0x01C0000B/C) derives another key than the
// certificate's with the default template; a verifier comparing the two
// sees it.
func (t *TPM) EK(ctx context.Context, kind EKKind) (*EK, error) {
	tr, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	if kind != EKAuto {
		return t.deriveEK(tr, kind)
	}
	defined, err := definedNV(tr, EKCertIndexRSA2048, EKCertIndexRSA4096)
	if err != nil {
		return nil, err
	}
	var first *EK
	for _, k := range ekKinds {
		idx := k.CertIndex()
		if !defined[idx] {
			continue
		}
		certKey := t.certifiedKey(tr, idx)
		ek, err := t.deriveEK(tr, k)
		if err != nil {
			continue // a kind this TPM cannot derive: try the next
		}
		if certKey != nil && certKey.Equal(ek.Public) {
			return ek, nil
		}
		if first == nil {
			first = ek
		}
	}
	if first != nil {
		return first, nil
	}
	rsa, err := t.implements(tr, tpm2.TPMAlgRSA)
	if err != nil {
		return nil, err
	}
	if rsa {
		return t.deriveEK(tr, EKRSA2048)
	}
	return t.deriveEK(tr, EKECCP256)
}

// certifiedKey returns the public key of the certificate at idx, or nil
// when it cannot be read or parsed.
func (t *TPM) certifiedKey(tr transport.TPM, idx uint32) interface{ Equal(crypto.PublicKey) bool } {
	data, err := t.readNVIndex(tr, idx)
	if err != nil || data == nil {
		return nil
	}
	cert, err := x509.ParseCertificate(trimDER(data))
	if err != nil {
		return nil
	}
	k, _ := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return k
}

// deriveEK derives the EK of kind; the caller holds t.mu.
func (t *TPM) deriveEK(tr transport.TPM, kind EKKind) (*EK, error) {
	tmpl, err := ekTemplate(kind)
	if err != nil {
		return nil, err
	}
	template := tpm2.Marshal(tmpl)
	what := "the " + kind.String() + " EK"
	lo, err := t.createPrimary(tr, tpm2.TPMRHEndorsement, template, what)
	if err != nil {
		return nil, err
	}
	ek := &EK{Kind: kind, PublicArea: lo.publicArea, Name: lo.name, template: template}
	pub, err := parsePublicArea(lo.publicArea)
	if err == nil {
		ek.Public, err = tpmpub.EKPublicKey(pub, tmpl)
	}
	if err != nil {
		err = fmt.Errorf("TPM2_CreatePrimary for %s: the TPM's answer: %w", what, err)
	}
	if ferr := t.flush(lo.handle, what); ferr != nil {
		err = errors.Join(err, ferr)
	}
	if err != nil {
		return nil, err
	}
	return ek, nil
}

// implements asks the TPM whether it implements alg (TPM2_GetCapability of
// TPM_CAP_ALGS, Part 3, section 30.2).
func (t *TPM) implements(tr transport.TPM, alg tpm2.TPMAlgID) (bool, error) {
	rsp, err := tpm2.GetCapability{Capability: tpm2.TPMCapAlgs, Property: uint32(alg), PropertyCount: 1}.Execute(tr)
	if err != nil {
		return false, fmt.Errorf("TPM2_GetCapability of TPM_CAP_ALGS: %w", err)
	}
	algs, err := rsp.CapabilityData.Data.Algorithms()
	if err != nil {
		return false, fmt.Errorf("TPM2_GetCapability of TPM_CAP_ALGS: %w", err)
	}
	for _, a := range algs.AlgProperties {
		if a.Alg == alg {
			return true, nil
		}
	}
	return false, nil
}

// definedNV lists the NV indices from first to last the TPM has defined,
// with TPM2_GetCapability of TPM_CAP_HANDLES (Part 3, section 30.2), as
// the EK Credential Profile recommends over probing each index.
func definedNV(tr transport.TPM, first, last uint32) (map[uint32]bool, error) {
	out := map[uint32]bool{}
	next := first
	for range 64 { // at most 64 answers: a TPM answering forever is cut off
		rsp, err := tpm2.GetCapability{Capability: tpm2.TPMCapHandles, Property: next, PropertyCount: 64}.Execute(tr)
		if err != nil {
			return nil, fmt.Errorf("TPM2_GetCapability of the NV indices from %#x: %w", next, err)
		}
		hs, err := rsp.CapabilityData.Data.Handles()
		if err != nil {
			return nil, fmt.Errorf("TPM2_GetCapability of the NV indices from %#x: %w", next, err)
		}
		for _, h := range hs.Handle {
			if uint32(h) < next || uint32(h) > last {
				return out, nil
			}
			out[uint32(h)] = true
			next = uint32(h) + 1
		}
		if !rsp.MoreData || len(hs.Handle) == 0 {
			return out, nil
		}
	}
	return out, nil
}

// EKCertificates reads the EK certificates the TPM holds at the indices of
// [EKKinds] (EKKind.CertIndex), and the EK certificate chain indices from
// [EKChainIndexFirst] on (at most [MaxEKChainIndices] of them), keyed by NV
// index; an index that is not defined is left out. It lists the defined
// indices with TPM2_GetCapability, then uses TPM2_NV_ReadPublic and
// TPM2_NV_Read (Part 3, sections 31.6 and 31.13), authorized by the index
// itself (TPMA_NV_AUTHREAD) or the owner (TPMA_NV_OWNERREAD), both with an
// empty authValue. Padding after the DER certificate of a certificate
// index is cut off; a chain index may hold several DER certificates one
// after the other ([SplitEKChain] splits them). The bytes are not parsed
// further: the verifier checks them.
func (t *TPM) EKCertificates(ctx context.Context) (map[uint32][]byte, error) {
	tr, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	certs := map[uint32][]byte{}
	defined, err := definedNV(tr, EKCertIndexRSA2048, EKCertIndexRSA4096)
	if err != nil {
		return nil, err
	}
	for _, k := range ekKinds {
		idx := k.CertIndex()
		if !defined[idx] {
			continue
		}
		data, err := t.readNVIndex(tr, idx)
		if err != nil {
			return nil, fmt.Errorf("read the %s EK certificate: %w", k, err)
		}
		if data != nil {
			certs[idx] = trimDER(data)
		}
	}
	chain, err := definedNV(tr, EKChainIndexFirst, EKChainIndexLast)
	if err != nil {
		return nil, err
	}
	read := 0
	for idx := EKChainIndexFirst; idx <= EKChainIndexLast && read < MaxEKChainIndices; idx++ {
		if !chain[idx] {
			continue
		}
		read++
		data, err := t.readNVIndex(tr, idx)
		if err != nil {
			return nil, fmt.Errorf("read the EK certificate chain at %#x: %w", idx, err)
		}
		if data != nil {
			certs[idx] = trimTrailingPadding(data)
		}
	}
	return certs, nil
}

// readNVIndex reads the whole of NV index idx; nil when the index went
// away between the listing and the read.
func (t *TPM) readNVIndex(tr transport.TPM, idx uint32) ([]byte, error) {
	pub, name, err := nvReadPublic(tr, idx)
	if errors.Is(err, errNVAbsent) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return t.nvRead(tr, idx, pub, name)
}

// SplitEKChain returns the DER certificates of the chain indices among
// certs (as [TPM.EKCertificates] returns them), in index order, each index
// split into the DER certificates it holds one after the other. Padding
// (0x00 or 0xFF bytes) after the last one is ignored; anything else is an
// error. At most [MaxEKChainCertificates] are returned.
func SplitEKChain(certs map[uint32][]byte) ([][]byte, error) {
	var idxs []uint32
	for idx := range certs {
		if IsEKChainIndex(idx) {
			idxs = append(idxs, idx)
		}
	}
	slices.Sort(idxs)
	var out [][]byte
	for _, idx := range idxs {
		rest := certs[idx]
		for len(rest) > 0 && !allPadding(rest) {
			n := derLength(rest)
			if n <= 0 {
				return nil, fmt.Errorf("EK certificate chain at %#x: bytes that are not a DER certificate at offset %d", idx, len(certs[idx])-len(rest))
			}
			if len(out) == MaxEKChainCertificates {
				return nil, fmt.Errorf("EK certificate chain: more than %d certificates", MaxEKChainCertificates)
			}
			out = append(out, bytes.Clone(rest[:n]))
			rest = rest[n:]
		}
	}
	return out, nil
}

func allPadding(b []byte) bool {
	for _, c := range b {
		if c != 0 && c != 0xFF {
			return false
		}
	}
	return true
}

// trimTrailingPadding cuts the 0x00 or 0xFF bytes after the DER
// certificates of a chain index larger than what it holds; bytes that are
// not DER certificates are left for [SplitEKChain] to refuse.
func trimTrailingPadding(b []byte) []byte {
	off := 0
	for off < len(b) {
		n := derLength(b[off:])
		if n <= 0 {
			break
		}
		off += n
	}
	if off > 0 && allPadding(b[off:]) {
		return bytes.Clone(b[:off])
	}
	return bytes.Clone(b)
}

// errNVAbsent is returned by nvReadPublic for an index that is not defined.
var errNVAbsent = errors.New("NV index not defined")

func nvReadPublic(tr transport.TPM, idx uint32) (*tpm2.TPMSNVPublic, []byte, error) {
	rsp, err := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(idx)}.Execute(tr)
	if errors.Is(err, tpm2.TPMRCHandle) {
		return nil, nil, fmt.Errorf("TPM2_NV_ReadPublic of %#x: %w", idx, errNVAbsent)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("TPM2_NV_ReadPublic of %#x: %w", idx, err)
	}
	pub, err := rsp.NVPublic.Contents()
	if err != nil {
		return nil, nil, fmt.Errorf("TPM2_NV_ReadPublic of %#x: %w", idx, err)
	}
	return pub, rsp.NVName.Buffer, nil
}

// nvRead reads the whole data of an NV index in chunks of at most
// TPM_PT_NV_BUFFER_MAX bytes.
func (t *TPM) nvRead(tr transport.TPM, idx uint32, pub *tpm2.TPMSNVPublic, name []byte) ([]byte, error) {
	var auth tpm2.AuthHandle
	switch {
	case pub.Attributes.ReadLocked:
		return nil, fmt.Errorf("NV %#x is read-locked", idx)
	case !pub.Attributes.Written:
		return nil, fmt.Errorf("NV %#x was never written", idx)
	case pub.Attributes.AuthRead:
		auth = tpm2.AuthHandle{Handle: tpm2.TPMHandle(idx), Name: tpm2.TPM2BName{Buffer: name}, Auth: tpm2.PasswordAuth(nil)}
	case pub.Attributes.OwnerRead:
		auth = tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)}
	default:
		return nil, fmt.Errorf("NV %#x can be read neither with its own nor with owner authorization", idx)
	}
	chunk, err := t.nvBufferMax(tr)
	if err != nil {
		return nil, err
	}
	size := int(pub.DataSize)
	out := make([]byte, 0, size)
	for len(out) < size {
		n := min(chunk, size-len(out))
		rsp, err := tpm2.NVRead{
			AuthHandle: auth,
			NVIndex:    tpm2.NamedHandle{Handle: tpm2.TPMHandle(idx), Name: tpm2.TPM2BName{Buffer: name}},
			Size:       uint16(n),
			Offset:     uint16(len(out)),
		}.Execute(tr)
		if err != nil {
			return nil, fmt.Errorf("TPM2_NV_Read of %#x at offset %d: %w", idx, len(out), err)
		}
		if len(rsp.Data.Buffer) != n {
			return nil, fmt.Errorf("TPM2_NV_Read of %#x at offset %d: %d bytes, asked for %d", idx, len(out), len(rsp.Data.Buffer), n)
		}
		out = append(out, rsp.Data.Buffer...)
	}
	return out, nil
}

// nvBufferMax returns TPM_PT_NV_BUFFER_MAX (Part 2, section 6.13), the
// largest TPM2_NV_Read, asking the TPM once.
func (t *TPM) nvBufferMax(tr transport.TPM) (int, error) {
	if t.nvMax > 0 {
		return t.nvMax, nil
	}
	rsp, err := tpm2.GetCapability{
		Capability:    tpm2.TPMCapTPMProperties,
		Property:      uint32(tpm2.TPMPTNVBufferMax),
		PropertyCount: 1,
	}.Execute(tr)
	if err != nil {
		return 0, fmt.Errorf("TPM2_GetCapability of TPM_PT_NV_BUFFER_MAX: %w", err)
	}
	props, err := rsp.CapabilityData.Data.TPMProperties()
	if err != nil {
		return 0, fmt.Errorf("TPM2_GetCapability of TPM_PT_NV_BUFFER_MAX: %w", err)
	}
	t.nvMax = 512 // the least a PC Client TPM supports
	for _, p := range props.TPMProperty {
		if p.Property == tpm2.TPMPTNVBufferMax && p.Value > 0 && p.Value <= 0xFFFF {
			t.nvMax = int(p.Value)
		}
	}
	return t.nvMax, nil
}

// trimDER cuts data after a DER SEQUENCE at its start when the SEQUENCE's
// length fits: NV indices are often larger than the certificate they hold.
func trimDER(data []byte) []byte {
	n := derLength(data)
	if n <= 0 {
		return data
	}
	return bytes.Clone(data[:n])
}

// derLength returns the length of the DER SEQUENCE at the start of data,
// header included, or 0 when data does not start with a whole one.
func derLength(data []byte) int {
	if len(data) < 2 || data[0] != 0x30 {
		return 0
	}
	n, hdr := int(data[1]), 2
	if n >= 0x80 {
		k := n & 0x7F
		if k == 0 || k > 3 || len(data) < 2+k {
			return 0
		}
		n = 0
		for _, b := range data[2 : 2+k] {
			n = n<<8 | int(b)
		}
		hdr += k
	}
	if hdr+n > len(data) {
		return 0
	}
	return hdr + n
}
