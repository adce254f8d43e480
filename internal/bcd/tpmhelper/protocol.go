package tpmhelper

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/nodetrust/nodetrust/tpm"
)

// protocolVersion is the "v" of the greeting.
const protocolVersion = 1

// The operations (see the package documentation).
const (
	opNodeKey  = "tpm.nodekey"
	opAK       = "tpm.ak"
	opSign     = "tpm.sign"
	opCertify  = "tpm.certify"
	opRelease  = "tpm.release"
	opEK       = "tpm.ek"
	opActivate = "tpm.activate"
	opQuote    = "tpm.quote"
)

// The error codes of a response.
const (
	codeDenied      = "denied"
	codeBadRequest  = "bad_request"
	codeUnknownKey  = "unknown_key"
	codeKeyChanged  = "key_changed"
	codeEKChanged   = "ek_changed"
	codeTimeout     = "timeout"
	codeUnavailable = "unavailable"
	codeTPM         = "tpm"
)

// Frame limits: requests are small; responses carry EK certificates.
const (
	maxRequestFrame  = 64 << 10
	maxResponseFrame = 1 << 20
)

// Size limits of request fields, from the TPM 2.0 structures they fill
// (Part 2): TPM2B_DATA holds at most a TPMT_HA's digest (64 bytes), and
// TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET fit in 1 KiB for the EKs this
// project supports (RSA 2048, ECC P-256 and P-384).
const (
	maxQualifyingData = 64
	maxCredential     = 1024
)

// greeting is the first frame of a connection, sent by the helper.
type greeting struct {
	Version int    `json:"v"`
	Code    string `json:"code,omitempty"`
	Error   string `json:"error,omitempty"`
}

// request is one call. Which fields are used depends on Op.
type request struct {
	Op string `json:"op"`
	// Record is a PEM "NODETRUST TPM KEY" (tpm.nodekey, tpm.ak).
	Record []byte `json:"record,omitempty"`
	// Unique names a key (tpm.sign, tpm.certify, tpm.release).
	Unique []byte `json:"unique,omitempty"`
	// AK names an AK by its unique (tpm.certify, tpm.activate, tpm.quote).
	AK             []byte `json:"ak,omitempty"`
	Digest         []byte `json:"digest,omitempty"`
	QualifyingData []byte `json:"qualifying_data,omitempty"`
	EKKind         string `json:"ek_kind,omitempty"`
	EKName         []byte `json:"ek_name,omitempty"`
	CredentialBlob []byte `json:"credential_blob,omitempty"`
	EncryptedSec   []byte `json:"encrypted_secret,omitempty"`
	Nonce          []byte `json:"nonce,omitempty"`
	PCRs           []int  `json:"pcrs,omitempty"`
}

// response is the answer to one call: Code and Error on failure, else the
// operation's fields. Every field is untrusted on the client's side.
type response struct {
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`

	Record       []byte            `json:"record,omitempty"`
	PublicArea   []byte            `json:"public_area,omitempty"`
	Name         []byte            `json:"name,omitempty"`
	Signature    []byte            `json:"signature,omitempty"`
	Attest       []byte            `json:"attest,omitempty"`
	Certificates map[uint32][]byte `json:"certificates,omitempty"`
	EKKind       string            `json:"ek_kind,omitempty"`
	Secret       []byte            `json:"secret,omitempty"`
	Quoted       []byte            `json:"quoted,omitempty"`
	PCRValues    map[int][]byte    `json:"pcr_values,omitempty"`
}

// writeFrame writes v as one frame.
func writeFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// errFrameSize is returned by readFrame for a frame over the limit.
var errFrameSize = errors.New("frame too large")

// readFrame reads one frame of at most limit bytes into v.
func readFrame(r io.Reader, limit int, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > uint32(limit) {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", errFrameSize, n, limit)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("malformed frame: %w", err)
	}
	return nil
}

// ekKindNames are the wire names of the EK kinds.
var ekKindNames = map[tpm.EKKind]string{
	tpm.EKAuto:    "auto",
	tpm.EKRSA2048: "rsa2048",
	tpm.EKECCP256: "eccp256",
	tpm.EKECCP384: "eccp384",
	// The other high-range templates of the TCG EK Credential Profile.
	tpm.EKRSA2048High: "rsa2048h",
	tpm.EKECCP256High: "eccp256h",
	tpm.EKECCP521:     "eccp521",
	tpm.EKRSA3072:     "rsa3072",
	tpm.EKRSA4096:     "rsa4096",
}

// ekKindList is the list of wire names errors give.
const ekKindList = "auto, rsa2048, eccp256, rsa2048h, eccp256h, eccp384, eccp521, rsa3072 or rsa4096"

func ekKindName(k tpm.EKKind) (string, error) {
	s, ok := ekKindNames[k]
	if !ok {
		return "", fmt.Errorf("unknown EK kind %d", int(k))
	}
	return s, nil
}

func parseEKKind(s string) (tpm.EKKind, error) {
	for k, name := range ekKindNames {
		if name == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown EK kind %q: want %s", s, ekKindList)
}
