package attest

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// QuotePCRs are the PCRs a quote must cover, in the SHA-256 bank: 0–7, the
// firmware's and boot loader's measurements (TCG PC Client Platform Firmware
// Profile, section 3.3.4), as the node's tpm.BootPCRs. It is for reading:
// VerifyQuote uses its own copy.
var QuotePCRs = []int{0, 1, 2, 3, 4, 5, 6, 7}

var quotePCRs = [...]int{0, 1, 2, 3, 4, 5, 6, 7}

// MinNonceSize is the shortest nonce VerifyQuote accepts: a shorter one
// (an empty one above all, which any quote without extraData would match)
// does not make a quote fresh and is a caller's mistake.
const MinNonceSize = 16

// maxAttestSize bounds a TPMS_ATTEST: a TPM2B_ATTEST holds at most
// sizeof(TPMS_ATTEST), well under 1 KiB for a quote or certification.
const maxAttestSize = 2048

// VerifyQuote checks a quote that the AK whose TPMT_PUBLIC is akPublicArea
// made with TPM2_Quote (TPM 2.0 Part 3, section 18.4), as tpm.TPM.Quote
// returns it: attest, the TPMS_ATTEST (Part 2, section 10.12.12; the contents
// of a TPM2B_ATTEST), signature, the AK's TPMT_SIGNATURE over it (Part 2,
// section 11.3.4), and pcrs, the PCR values the node reported.
//
// It checks that the AK is acceptable ([ErrAK]); that signature is the AK's
// ECDSA/SHA-256 signature over sha256(attest); that attest is a
// TPM_ST_ATTEST_QUOTE starting with TPM_GENERATED_VALUE (so the TPM made it:
// a restricted key signs nothing else); that its extraData is nonce
// (compared in constant time; nonce must have at least MinNonceSize bytes);
// that it selects exactly the SHA-256 bank's PCRs 0–7 ([QuotePCRs]); and
// that pcrs holds exactly those eight 32-byte values and their SHA-256, in
// index order, is the quoted pcrDigest. After it returns nil the values in
// pcrs are the AK's TPM's.
//
// The caller must have proven the AK (credential activation with a trusted
// EK, or a LAK certificate it issued) and made nonce fresh for this
// session. The quote's clock and firmware version are not checked. Errors
// wrap [ErrQuote].
func VerifyQuote(akPublicArea, attest, signature []byte, nonce []byte, pcrs map[int][]byte) error {
	if err := verifyQuote(akPublicArea, attest, signature, nonce, pcrs); err != nil {
		return fmt.Errorf("%w: %w", ErrQuote, err)
	}
	return nil
}

func verifyQuote(akPublicArea, attest, signature []byte, nonce []byte, pcrs map[int][]byte) error {
	if len(nonce) < MinNonceSize {
		return fmt.Errorf("nonce of %d bytes, want at least %d", len(nonce), MinNonceSize)
	}
	a, err := verifyAttest(akPublicArea, attest, signature, tpm2.TPMSTAttestQuote)
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(a.ExtraData.Buffer, nonce) != 1 {
		return errors.New("the quote's extraData is not this session's nonce")
	}
	info, err := a.Attested.Quote()
	if err != nil {
		return fmt.Errorf("quote info: %w", err)
	}
	if err := checkQuoteSelection(info.PCRSelect); err != nil {
		return err
	}
	if len(pcrs) != len(quotePCRs) {
		return fmt.Errorf("%d PCR values, want %d (PCRs 0-7)", len(pcrs), len(quotePCRs))
	}
	h := sha256.New()
	for _, i := range quotePCRs {
		v, ok := pcrs[i]
		if !ok {
			return fmt.Errorf("no value for PCR %d", i)
		}
		if len(v) != sha256.Size {
			return fmt.Errorf("PCR %d value of %d bytes, want %d", i, len(v), sha256.Size)
		}
		h.Write(v)
	}
	if subtle.ConstantTimeCompare(h.Sum(nil), info.PCRDigest.Buffer) != 1 {
		return errors.New("the PCR values reported are not the quoted ones (pcrDigest differs)")
	}
	return nil
}

// checkQuoteSelection checks that sel is exactly the SHA-256 bank's PCRs
// 0–7. A TPM echoes the selection it was asked for; the PC Client's is 3
// bytes, and at most 4 are accepted here (Part 2, section 10.6.2
// TPMS_PCR_SELECTION).
func checkQuoteSelection(sel tpm2.TPMLPCRSelection) error {
	if len(sel.PCRSelections) != 1 {
		return fmt.Errorf("the quote selects %d PCR banks, want the SHA-256 bank alone", len(sel.PCRSelections))
	}
	s := sel.PCRSelections[0]
	if s.Hash != tpm2.TPMAlgSHA256 {
		return fmt.Errorf("the quote selects the bank of hash %#x, want SHA-256", uint16(s.Hash))
	}
	if len(s.PCRSelect) == 0 || len(s.PCRSelect) > 4 || s.PCRSelect[0] != 0xFF || !allZero(s.PCRSelect[1:]) {
		return fmt.Errorf("the quote selects PCR bitmap %x, want PCRs 0-7 (ff0000)", s.PCRSelect)
	}
	return nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// verifyAttest checks the AK, verifies signature over attest with it, and
// parses attest, checking its magic and type. It is shared by quotes and
// certifications.
func verifyAttest(akPublicArea, attest, signature []byte, typ tpm2.TPMST) (*tpm2.TPMSAttest, error) {
	ak, err := checkAK(akPublicArea)
	if err != nil {
		return nil, err
	}
	if len(attest) == 0 || len(attest) > maxAttestSize {
		return nil, fmt.Errorf("TPMS_ATTEST of %d bytes, want 1 to %d", len(attest), maxAttestSize)
	}
	if err := tpmpub.VerifySignature(ak, attest, signature); err != nil {
		return nil, err
	}
	return tpmpub.CheckAttest(attest, typ)
}
