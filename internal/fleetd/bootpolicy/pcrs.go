package bootpolicy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/nodetrust/nodetrust/attest"
)

// MaxPCRFileSize bounds a PCR values file: tpm2_pcrread's output of every
// bank is a few kilobytes.
const MaxPCRFileSize = 64 << 10

// ParsePCRs reads the SHA-256 values of PCRs 0–7 from the text that
// `tpm2_pcrread sha256:0,1,2,3,4,5,6,7` prints, or from lines of the same
// shape written by hand ("4 : 0x<64 hex digits>", "4: <hex>"). Bank
// headers ("sha1:", "sha256:") switch banks and only the SHA-256 bank is
// read; without a header the values are taken as SHA-256. Values of PCRs
// above 7 are ignored, since a quote covers PCRs 0–7. Every one of PCRs
// 0–7 must be given, once. Blank lines and lines starting with '#' are
// skipped.
func ParsePCRs(b []byte) (map[int][]byte, error) {
	if len(b) > MaxPCRFileSize {
		return nil, fmt.Errorf("%d bytes of PCR values, more than %d", len(b), MaxPCRFileSize)
	}
	out := map[int][]byte{}
	bank := "sha256"
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 1024), MaxPCRFileSize)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		key, value, ok := strings.Cut(s, ":")
		if !ok {
			return nil, fmt.Errorf("line %d: want \"INDEX : HEX\" or a bank name such as \"sha256:\"", line)
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if value == "" {
			bank = strings.ToLower(key)
			continue
		}
		if bank != "sha256" {
			continue
		}
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i > 23 {
			return nil, fmt.Errorf("line %d: %q is not a PCR index (0 to 23)", line, capString(key, 16))
		}
		h := strings.TrimPrefix(strings.TrimPrefix(value, "0x"), "0X")
		v, err := hex.DecodeString(h)
		if err != nil || len(v) != sha256.Size {
			return nil, fmt.Errorf("line %d: PCR %d: want 64 hex digits (a SHA-256 value)", line, i)
		}
		if i > 7 {
			continue
		}
		if _, dup := out[i]; dup {
			return nil, fmt.Errorf("line %d: PCR %d is given twice", line, i)
		}
		out[i] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read PCR values: %w", err)
	}
	for _, i := range attest.QuotePCRs {
		if _, ok := out[i]; !ok {
			return nil, fmt.Errorf("no SHA-256 value for PCR %d: capture PCRs 0-7 (tpm2_pcrread sha256:0,1,2,3,4,5,6,7)", i)
		}
	}
	return out, nil
}

// ReadEvidenceFiles reads a boot captured for an offline check: the event
// log at logPath (at most attest.MaxEventLogSize bytes) and the PCR values
// at pcrsPath ([ParsePCRs]). The evidence has no quote.
func ReadEvidenceFiles(logPath, pcrsPath string) (Evidence, error) {
	log, err := readBounded(logPath, attest.MaxEventLogSize)
	if err != nil {
		return Evidence{}, fmt.Errorf("read the event log: %w", err)
	}
	raw, err := readBounded(pcrsPath, MaxPCRFileSize)
	if err != nil {
		return Evidence{}, fmt.Errorf("read the PCR values: %w", err)
	}
	pcrs, err := ParsePCRs(raw)
	if err != nil {
		return Evidence{}, fmt.Errorf("%s: %w", pcrsPath, err)
	}
	return Evidence{PCRs: pcrs, EventLog: log}, nil
}
