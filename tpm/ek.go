package tpm

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// NV indices of the EK certificates, from the TCG EK Credential Profile for
// TPM Family 2.0 (version 2.5, section 2.2.1.4 "Low Range" and 2.2.1.5 "High
// Range").
const (
	EKCertIndexRSA2048 uint32 = 0x01C00002 // template L-1
	EKCertIndexECCP256 uint32 = 0x01C0000A // template L-2
	EKCertIndexECCP384 uint32 = 0x01C00016 // template H-3
)

// EKKind names one of the EK templates of the TCG EK Credential Profile.
type EKKind int

const (
	// EKAuto picks the EK whose certificate the TPM holds: RSA 2048 first,
	// then ECC P-256, then ECC P-384; RSA 2048 when it holds none.
	EKAuto EKKind = iota
	// EKRSA2048 is template L-1: RSA 2048, SHA-256 names, AES-128-CFB.
	EKRSA2048
	// EKECCP256 is template L-2: ECC NIST P-256, SHA-256 names, AES-128-CFB.
	EKECCP256
	// EKECCP384 is template H-3: ECC NIST P-384, SHA-384 names,
	// AES-256-CFB, userWithAuth (the one swtpm_setup certifies).
	EKECCP384
)

// ekKinds lists the concrete kinds in EKAuto's order of preference.
var ekKinds = []EKKind{EKRSA2048, EKECCP256, EKECCP384}

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
	default:
		return 0
	}
}

// Template returns the kind's default template (EK Credential Profile,
// section B.3); EKAuto has none.
func (k EKKind) Template() (tpm2.TPMTPublic, error) { return ekTemplate(k) }

// policyBSHA384 is PolicyB of the EK Credential Profile (section B.6.4):
// PolicyOR(PolicyA = PolicySecret(TPM_RH_ENDORSEMENT), PolicyC), SHA-384.
var policyBSHA384 = []byte{
	0xB2, 0x6E, 0x7D, 0x28, 0xD1, 0x1A, 0x50, 0xBC, 0x53, 0xD8, 0x82, 0xBC,
	0xF5, 0xFD, 0x3A, 0x1A, 0x07, 0x41, 0x48, 0xBB, 0x35, 0xD3, 0xB4, 0xE4,
	0xCB, 0x1C, 0x0A, 0xD9, 0xBD, 0xE4, 0x19, 0xCA, 0xCB, 0x47, 0xBA, 0x09,
	0x69, 0x96, 0x46, 0x15, 0x0F, 0x9F, 0xC0, 0x00, 0xF3, 0xF8, 0x0E, 0x12,
}

// ekTemplate returns the default template of k (EK Credential Profile,
// section B.3). The low-range ones are go-tpm's; their authPolicy is
// PolicySecret(TPM_RH_ENDORSEMENT) and userWithAuth is clear.
func ekTemplate(k EKKind) (tpm2.TPMTPublic, error) {
	switch k {
	case EKRSA2048:
		return tpm2.RSAEKTemplate, nil
	case EKECCP256:
		return tpm2.ECCEKTemplate, nil
	case EKECCP384:
		return tpm2.TPMTPublic{
			Type:    tpm2.TPMAlgECC,
			NameAlg: tpm2.TPMAlgSHA384,
			ObjectAttributes: tpm2.TPMAObject{
				FixedTPM:            true,
				FixedParent:         true,
				SensitiveDataOrigin: true,
				UserWithAuth:        true,
				AdminWithPolicy:     true,
				Restricted:          true,
				Decrypt:             true,
			},
			AuthPolicy: tpm2.TPM2BDigest{Buffer: policyBSHA384},
			Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
				Symmetric: tpm2.TPMTSymDefObject{
					Algorithm: tpm2.TPMAlgAES,
					KeyBits:   tpm2.NewTPMUSymKeyBits(tpm2.TPMAlgAES, tpm2.TPMKeyBits(256)),
					Mode:      tpm2.NewTPMUSymMode(tpm2.TPMAlgAES, tpm2.TPMAlgCFB),
				},
				Scheme:  tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
				CurveID: tpm2.TPMECCNistP384,
				KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
			}),
			Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{}),
		}, nil
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
// flushed. EKAuto picks the kind whose certificate the TPM holds.
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
	if kind == EKAuto {
		kind = EKRSA2048
		for _, k := range ekKinds {
			_, _, err := nvReadPublic(tr, k.CertIndex())
			if errors.Is(err, errNVAbsent) {
				continue
			}
			if err != nil {
				return nil, err
			}
			kind = k
			break
		}
	}
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

// EKCertificates reads the EK certificates the TPM holds at
// [EKCertIndexRSA2048], [EKCertIndexECCP256] and [EKCertIndexECCP384], keyed
// by NV index; an index that is not defined is left out. It uses
// TPM2_NV_ReadPublic and TPM2_NV_Read (Part 3, sections 31.6 and 31.13),
// authorized by the index itself (TPMA_NV_AUTHREAD) or the owner
// (TPMA_NV_OWNERREAD), both with an empty authValue. Padding after the DER
// certificate is cut off; the bytes are not parsed further.
func (t *TPM) EKCertificates(ctx context.Context) (map[uint32][]byte, error) {
	tr, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	certs := map[uint32][]byte{}
	for _, k := range ekKinds {
		idx := k.CertIndex()
		pub, name, err := nvReadPublic(tr, idx)
		if errors.Is(err, errNVAbsent) {
			continue
		}
		if err != nil {
			return nil, err
		}
		data, err := t.nvRead(tr, idx, pub, name)
		if err != nil {
			return nil, fmt.Errorf("read the %s EK certificate: %w", k, err)
		}
		certs[idx] = trimDER(data)
	}
	return certs, nil
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
	if len(data) < 2 || data[0] != 0x30 {
		return data
	}
	n, hdr := int(data[1]), 2
	if n >= 0x80 {
		k := n & 0x7F
		if k == 0 || k > 3 || len(data) < 2+k {
			return data
		}
		n = 0
		for _, b := range data[2 : 2+k] {
			n = n<<8 | int(b)
		}
		hdr += k
	}
	if hdr+n > len(data) {
		return data
	}
	return bytes.Clone(data[:hdr+n])
}
