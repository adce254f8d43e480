package tpm

import (
	"bytes"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// KeyRecordPEMType is the PEM type of a marshalled [KeyRecord]. node.key
// holds one when the node key lives in the TPM.
const KeyRecordPEMType = "NODETRUST TPM KEY"

// ErrNotKeyRecord is returned by [ParseKeyRecord] for input that is not a PEM
// block of type [KeyRecordPEMType] (a PKCS#8 file key, say).
var ErrNotKeyRecord = errors.New("not a " + KeyRecordPEMType + " PEM block")

// KeyKind says what a [KeyRecord] derives.
type KeyKind int

const (
	// KindNodeKey is the node key: an unrestricted ECDSA P-256 signing key
	// (see [CheckNodeKeyAttributes]).
	KindNodeKey KeyKind = iota + 1
	// KindAK is the attestation key: a restricted ECDSA P-256 signing key
	// (see [CheckAKAttributes]).
	KindAK
)

func (k KeyKind) String() string {
	switch k {
	case KindNodeKey:
		return "node-key"
	case KindAK:
		return "ak"
	default:
		return fmt.Sprintf("KeyKind(%d)", int(k))
	}
}

func parseKeyKind(s string) (KeyKind, error) {
	switch s {
	case "node-key":
		return KindNodeKey, nil
	case "ak":
		return KindAK, nil
	default:
		return 0, fmt.Errorf("unknown key kind %q", s)
	}
}

// UniqueSize is the number of random bytes a new record puts in its
// template's unique field.
const UniqueSize = 32

// KeyRecord is what it takes to derive a key in a TPM again with
// TPM2_CreatePrimary (Part 3, section 24.1): the hierarchy and the template,
// a TPMT_PUBLIC (Part 2, section 12.2.4) whose unique field holds
// [UniqueSize] random bytes. A TPM derives a primary key from its hierarchy's
// seed and the template (Part 1, section 27.1), so the same record derives
// the same key on the same TPM, and another key once the hierarchy's seed
// changed (the owner hierarchy's changes with TPM2_Clear).
//
// A record is not a secret: the key never leaves the TPM, and only a caller
// that can use the hierarchy (owner authorization, here empty) can derive it.
type KeyRecord struct {
	Kind KeyKind
	// Hierarchy is the TPM_RH handle of the hierarchy (Part 2, section
	// 7.4): TPM_RH_OWNER (0x40000001) for the keys this package makes.
	Hierarchy uint32
	// Template is the marshalled TPMT_PUBLIC given to TPM2_CreatePrimary.
	Template []byte
	// Name is the TPM name (Part 1, section 16) of the key the record
	// derived when it was made, so that a load can tell a TPM that derives
	// another key (ErrKeyChanged). Empty means unknown: not checked.
	Name []byte
}

// keyRecordASN1 is the DER body of the PEM block:
//
//	KeyRecord ::= SEQUENCE {
//	    version    INTEGER (1),
//	    kind       UTF8String ("node-key" | "ak"),
//	    hierarchy  INTEGER,
//	    template   OCTET STRING,  -- TPMT_PUBLIC
//	    name       OCTET STRING   -- TPM2B_NAME contents, may be empty
//	}
type keyRecordASN1 struct {
	Version   int
	Kind      string `asn1:"utf8"`
	Hierarchy int64
	Template  []byte
	Name      []byte
}

const keyRecordVersion = 1

// MarshalKeyRecord returns r as a PEM block of type [KeyRecordPEMType].
func MarshalKeyRecord(r KeyRecord) ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("marshal TPM key record: %w", err)
	}
	der, err := asn1.Marshal(keyRecordASN1{
		Version:   keyRecordVersion,
		Kind:      r.Kind.String(),
		Hierarchy: int64(r.Hierarchy),
		Template:  r.Template,
		Name:      r.Name,
	})
	if err != nil {
		return nil, fmt.Errorf("marshal TPM key record: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: KeyRecordPEMType, Bytes: der}), nil
}

// ParseKeyRecord parses a PEM block written by [MarshalKeyRecord]. Input that
// is not such a block returns an error wrapping [ErrNotKeyRecord]; a block
// that is, but does not hold a valid record, returns another error. The
// template must have the attributes of its kind (see
// [CheckNodeKeyAttributes] and [CheckAKAttributes]), so a changed file cannot
// make the TPM derive another kind of key.
func ParseKeyRecord(data []byte) (KeyRecord, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != KeyRecordPEMType {
		return KeyRecord{}, ErrNotKeyRecord
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return KeyRecord{}, errors.New("parse TPM key record: data after the PEM block")
	}
	if len(block.Headers) != 0 {
		return KeyRecord{}, errors.New("parse TPM key record: unexpected PEM headers")
	}
	var a keyRecordASN1
	trailing, err := asn1.Unmarshal(block.Bytes, &a)
	if err != nil {
		return KeyRecord{}, fmt.Errorf("parse TPM key record: %w", err)
	}
	if len(trailing) != 0 {
		return KeyRecord{}, errors.New("parse TPM key record: data after the record")
	}
	if a.Version != keyRecordVersion {
		return KeyRecord{}, fmt.Errorf("parse TPM key record: version %d, want %d", a.Version, keyRecordVersion)
	}
	kind, err := parseKeyKind(a.Kind)
	if err != nil {
		return KeyRecord{}, fmt.Errorf("parse TPM key record: %w", err)
	}
	if a.Hierarchy < 0 || a.Hierarchy > 0xFFFFFFFF {
		return KeyRecord{}, fmt.Errorf("parse TPM key record: hierarchy %#x out of range", a.Hierarchy)
	}
	r := KeyRecord{Kind: kind, Hierarchy: uint32(a.Hierarchy), Template: a.Template, Name: a.Name}
	if len(r.Name) == 0 {
		r.Name = nil
	}
	if err := r.validate(); err != nil {
		return KeyRecord{}, fmt.Errorf("parse TPM key record: %w", err)
	}
	return r, nil
}

// validate checks the record's kind, hierarchy and template.
func (r KeyRecord) validate() error {
	if r.Hierarchy != uint32(tpm2.TPMRHOwner) && r.Hierarchy != uint32(tpm2.TPMRHEndorsement) {
		return fmt.Errorf("hierarchy %#x: want TPM_RH_OWNER or TPM_RH_ENDORSEMENT", r.Hierarchy)
	}
	var want tpm2.TPMTPublic
	switch r.Kind {
	case KindNodeKey:
		want = nodeKeyTemplate(nil)
	case KindAK:
		want = akTemplate(nil)
	default:
		return fmt.Errorf("unknown key kind %d", int(r.Kind))
	}
	tmpl, err := parsePublicArea(r.Template)
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	if err := checkSameKind(tmpl, want); err != nil {
		return fmt.Errorf("template of a %s: %w", r.Kind, err)
	}
	point, err := tmpl.Unique.ECC()
	if err != nil || len(point.X.Buffer) != UniqueSize || len(point.Y.Buffer) != 0 {
		return fmt.Errorf("template of a %s: the unique field must hold %d bytes", r.Kind, UniqueSize)
	}
	if len(r.Name) != 0 && len(r.Name) != 2+32 {
		return fmt.Errorf("name of %d bytes: want a SHA-256 TPM name", len(r.Name))
	}
	return nil
}

// Unique returns the random bytes in the record's template, which tell
// records apart (bcd helper names keys by them). It returns nil for a record
// that does not validate.
func (r KeyRecord) Unique() []byte {
	if r.validate() != nil {
		return nil
	}
	tmpl, err := parsePublicArea(r.Template)
	if err != nil {
		return nil
	}
	point, err := tmpl.Unique.ECC()
	if err != nil {
		return nil
	}
	return bytes.Clone(point.X.Buffer)
}
