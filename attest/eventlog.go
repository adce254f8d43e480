package attest

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	gattest "github.com/google/go-attestation/attest"
)

// MaxEventLogSize is the largest measurement log ReplayEventLog parses.
// Firmware logs are tens of kilobytes; the largest seen are a few hundred.
const MaxEventLogSize = 2 << 20

// Event types the replay needs (TCG PC Client Platform Firmware Profile,
// section 10.4.1).
const (
	evNoAction = 0x00000003
)

// startupLocality is the signature of the TCG_EfiStartupLocalityEvent (PC
// Client Platform Firmware Profile, section 9.4.5.3): "StartupLocality\0"
// followed by the locality TPM2_Startup came from, which is PCR 0's initial
// value's last byte.
var startupLocality = []byte("StartupLocality\x00")

// EventLog is what [ReplayEventLog] verified of a measurement log.
type EventLog struct {
	// Events are the events of the PCRs given whose replay matched, in log
	// order, each with its SHA-256 digest (the one the replay used). An
	// event's Data is the log's: only its digest is verified, so Data may
	// be trusted only where it is checked against the digest (as
	// ParseSecurebootState does for what it reads) — see go-attestation's
	// docs/event-log-disclosure.md. Empty for an empty log.
	Events []gattest.Event
	// SecureBoot is the Secure Boot state of go-attestation's
	// ParseSecurebootState over Events when the log measures PCR 7 and PCR
	// 7 is among the PCRs given; nil otherwise. A nil SecureBoot means the
	// state is unknown, never that Secure Boot is off.
	SecureBoot *gattest.SecurebootState

	// replayed holds the PCRs the log was replayed against.
	replayed map[int]bool
}

// ReplayEventLog checks log, the node's TCG measurement log (the binary
// format of /sys/kernel/security/tpm0/binary_bios_measurements, crypto-agile
// with SHA-256 digests), against pcrs, SHA-256 PCR values that
// [VerifyQuote] verified.
//
// It parses the log with go-attestation's ParseEventLog and replays it with
// (*EventLog).Verify: every PCR given that has events must be the SHA-256
// extension of their digests, in log order. A PCR given that has no event
// must hold its initial value (all zero; for PCR 0 the locality of a
// StartupLocality event in the last byte; all 0xff for PCRs 17–22), since
// go-attestation accepts any value there and a log stripped of a PCR's
// events would otherwise pass. An empty log is a log without events: a
// fresh TPM (swtpm, the simulator) with PCRs 0–7 all zero passes with it.
//
// When the log measures PCR 7 and PCR 7 is given, the Secure Boot state is
// parsed with ParseSecurebootState; a log whose state cannot be determined
// (an unexpected PCR 7 event, a UEFI debugger, a variable after the
// separator…) is refused.
//
// Events on PCRs not given are neither verified nor returned. Errors wrap
// [ErrEventLog].
func ReplayEventLog(log []byte, pcrs map[int][]byte) (*EventLog, error) {
	out, err := replayEventLog(log, pcrs)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEventLog, err)
	}
	return out, nil
}

func replayEventLog(log []byte, pcrs map[int][]byte) (*EventLog, error) {
	if len(pcrs) == 0 {
		return nil, errors.New("no PCR values to replay the log against")
	}
	indices := make([]int, 0, len(pcrs))
	replayed := make(map[int]bool, len(pcrs))
	for i, v := range pcrs {
		if i < 0 || i > 23 {
			return nil, fmt.Errorf("PCR %d: want 0 to 23", i)
		}
		if len(v) != sha256.Size {
			return nil, fmt.Errorf("PCR %d value of %d bytes, want %d", i, len(v), sha256.Size)
		}
		indices = append(indices, i)
		replayed[i] = true
	}
	slices.Sort(indices)
	if len(log) > MaxEventLogSize {
		return nil, fmt.Errorf("event log of %d bytes, more than %d", len(log), MaxEventLogSize)
	}

	if len(log) == 0 {
		for _, i := range indices {
			if !bytes.Equal(pcrs[i], initialPCRValue(i, 0)) {
				return nil, fmt.Errorf("PCR %d has no event in the (empty) log but is not at its initial value", i)
			}
		}
		return &EventLog{replayed: replayed}, nil
	}

	el, err := parseEventLog(log)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(el.Algs, gattest.HashSHA256) {
		return nil, errors.New("the log has no SHA-256 digests")
	}

	// Which PCRs the log measures, and PCR 0's startup locality.
	measured := map[int]bool{}
	locality := byte(0)
	for _, e := range el.Events(gattest.HashSHA256) {
		if e.Type == evNoAction {
			if e.Index == 0 && len(e.Data) == len(startupLocality)+1 && bytes.HasPrefix(e.Data, startupLocality) {
				locality = e.Data[len(startupLocality)]
			}
			continue
		}
		measured[e.Index] = true
	}

	given := make([]gattest.PCR, 0, len(indices))
	for _, i := range indices {
		given = append(given, gattest.PCR{Index: i, Digest: pcrs[i], DigestAlg: crypto.SHA256})
	}
	events, err := verifyEventLog(el, given)
	if err != nil {
		return nil, err
	}
	for _, i := range indices {
		if !measured[i] && !bytes.Equal(pcrs[i], initialPCRValue(i, locality)) {
			return nil, fmt.Errorf("PCR %d has no event in the log but is not at its initial value", i)
		}
	}

	out := &EventLog{Events: events, replayed: replayed}
	if pcrs[7] != nil && measured[7] {
		sb, err := parseSecurebootState(events)
		if err != nil {
			return nil, err
		}
		out.SecureBoot = sb
	}
	return out, nil
}

// initialPCRValue is the value of SHA-256 PCR i after TPM2_Startup (TPM 2.0
// Part 1, section 17.6; PC Client Platform TPM Profile, section 4.6.2): all
// zero, with PCR 0's last byte the startup locality, and all ones for the
// dynamic-launch PCRs 17–22.
func initialPCRValue(i int, locality byte) []byte {
	v := make([]byte, sha256.Size)
	switch {
	case i == 0:
		v[len(v)-1] = locality
	case i >= 17 && i <= 22:
		for j := range v {
			v[j] = 0xFF
		}
	}
	return v
}

// parseEventLog is gattest.ParseEventLog, with a panic turned into an error.
func parseEventLog(log []byte) (el *gattest.EventLog, err error) {
	defer func() {
		if r := recover(); r != nil {
			el, err = nil, fmt.Errorf("malformed event log: %v", r)
		}
	}()
	el, err = gattest.ParseEventLog(log)
	if err != nil {
		return nil, fmt.Errorf("parse event log: %w", err)
	}
	return el, nil
}

// verifyEventLog is (*gattest.EventLog).Verify, with a panic turned into an
// error.
func verifyEventLog(el *gattest.EventLog, pcrs []gattest.PCR) (events []gattest.Event, err error) {
	defer func() {
		if r := recover(); r != nil {
			events, err = nil, fmt.Errorf("replay event log: %v", r)
		}
	}()
	events, err = el.Verify(pcrs)
	if err != nil {
		var re gattest.ReplayError
		if errors.As(err, &re) {
			return nil, fmt.Errorf("the log does not replay to the quoted values of PCRs %v", re.InvalidPCRs)
		}
		return nil, fmt.Errorf("replay event log: %w", err)
	}
	return events, nil
}

// parseSecurebootState is gattest.ParseSecurebootState, with a panic turned
// into an error.
func parseSecurebootState(events []gattest.Event) (sb *gattest.SecurebootState, err error) {
	defer func() {
		if r := recover(); r != nil {
			sb, err = nil, fmt.Errorf("secure boot state: %v", r)
		}
	}()
	sb, err = gattest.ParseSecurebootState(events)
	if err != nil {
		return nil, fmt.Errorf("secure boot state: %w", err)
	}
	return sb, nil
}
