package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// RenewProofLabel starts the data whose SHA-256 a renewal proof of
// possession signs (purpose renew-pop).
const RenewProofLabel = "nodetrust renew-pop v1"

// RenewProofDigest returns SHA-256("nodetrust renew-pop v1" || 0x00 ||
// csrSHA256 || clientTimeUnixNano as 8 bytes big endian), what the current
// node key signs in a RenewRequest's proof.
func RenewProofDigest(csrSHA256 []byte, clientTimeUnixNano int64) []byte {
	h := sha256.New()
	h.Write([]byte(RenewProofLabel))
	h.Write([]byte{0})
	h.Write(csrSHA256)
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(clientTimeUnixNano)))
	return h.Sum(nil)
}

// SignRenewProof signs [RenewProofDigest] with the current node key (ECDSA)
// and returns the IEEE P1363 signature. csrSHA256 is the SHA-256 of the new
// key's CSR and t the client time in Unix nanoseconds sent with it.
func SignRenewProof(signer crypto.Signer, csrSHA256 []byte, t int64) ([]byte, error) {
	if len(csrSHA256) != sha256.Size {
		return nil, fmt.Errorf("sign renewal proof: CSR hash is %d bytes, want %d", len(csrSHA256), sha256.Size)
	}
	sig, err := SignP1363(signer, RenewProofDigest(csrSHA256, t))
	if err != nil {
		return nil, fmt.Errorf("sign renewal proof: %w", err)
	}
	return sig, nil
}

// VerifyRenewProof checks a renewal proof under pub, the public key of the
// node's current certificate. A failure wraps [ErrRenewProof]. It does not
// judge t: the caller checks that the client time is recent.
func VerifyRenewProof(pub crypto.PublicKey, csrSHA256 []byte, t int64, sig []byte) error {
	if len(csrSHA256) != sha256.Size {
		return fmt.Errorf("verify renewal proof: CSR hash is %d bytes, want %d: %w", len(csrSHA256), sha256.Size, ErrRenewProof)
	}
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok || k == nil {
		return fmt.Errorf("verify renewal proof: key is %T, want ECDSA: %w", pub, ErrRenewProof)
	}
	if !VerifyP1363(k, RenewProofDigest(csrSHA256, t), sig) {
		return fmt.Errorf("verify renewal proof: signature does not verify under the current key: %w", ErrRenewProof)
	}
	return nil
}
