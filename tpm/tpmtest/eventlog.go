package tpmtest

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"unicode/utf16"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/tcp"
)

// Event types firmware logs (TCG PC Client Platform Firmware Profile,
// section 10.4.1).
const (
	EvNoAction                   = 0x00000003
	EvSeparator                  = 0x00000004
	EvSCRTMVersion               = 0x00000008
	EvEFIVariableDriverConfig    = 0x80000001
	EvEFIBootServicesApplication = 0x80000003
	EvEFIAction                  = 0x80000007
	EvEFIVariableAuthority       = 0x800000E0
)

// GUIDs of UEFI 2.10 (section 3.3 and 32.4.1), in their byte order on the
// wire: the first three fields little-endian.
var (
	guidGlobalVariable = [16]byte{0x61, 0xdf, 0xe4, 0x8b, 0xca, 0x93, 0xd2, 0x11, 0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c}
	guidImageSecurity  = [16]byte{0xcb, 0xb2, 0x19, 0xd7, 0x3a, 0x3d, 0x96, 0x45, 0xa3, 0xbc, 0xda, 0xd0, 0x0e, 0x67, 0x65, 0x6f}
	guidCertX509       = [16]byte{0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72}
	guidCertSHA256     = [16]byte{0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40, 0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28}
	guidOwner          = [16]byte{0x77, 0xfa, 0x9a, 0xbd, 0x03, 0x59, 0xb2, 0x4d, 0x9d, 0x56, 0x4b, 0x69, 0x44, 0x07, 0x2f, 0x6f}
)

// Event is one event of a measurement log.
type Event struct {
	PCR  int
	Type uint32
	Data []byte
	// Digest is what the PCR is extended with; nil means SHA-256(Data)
	// (zero for EV_NO_ACTION, which extends nothing).
	Digest []byte
}

func (e Event) digest() []byte {
	if e.Digest != nil {
		return e.Digest
	}
	if e.Type == EvNoAction {
		return make([]byte, sha256.Size)
	}
	d := sha256.Sum256(e.Data)
	return d[:]
}

// EventLog builds a TCG measurement log the way UEFI firmware writes one
// (crypto-agile, SHA-256 digests only) so that tests can measure a boot:
// extend its events into a TPM ([EventLog.Extend]), quote, and hand the
// log to a verifier. The zero value is an empty log.
type EventLog struct {
	Events []Event
}

// Add appends events.
func (l *EventLog) Add(events ...Event) { l.Events = append(l.Events, events...) }

// SecureBootVariables appends the PCR 7 measurements of the Secure Boot
// variables firmware makes before its separator: SecureBoot (1 when
// enabled), PK, KEK and db holding the given certificates, and dbx holding
// dbxHashes (SHA-256 image hashes).
func (l *EventLog) SecureBootVariables(enabled bool, pk, kek, db []*x509.Certificate, dbxHashes [][]byte) {
	sb := []byte{0}
	if enabled {
		sb[0] = 1
	}
	l.Add(
		Event{PCR: 7, Type: EvEFIVariableDriverConfig, Data: variableData(guidGlobalVariable, "SecureBoot", sb)},
		Event{PCR: 7, Type: EvEFIVariableDriverConfig, Data: variableData(guidGlobalVariable, "PK", certLists(pk))},
		Event{PCR: 7, Type: EvEFIVariableDriverConfig, Data: variableData(guidGlobalVariable, "KEK", certLists(kek))},
		Event{PCR: 7, Type: EvEFIVariableDriverConfig, Data: variableData(guidImageSecurity, "db", certLists(db))},
		Event{PCR: 7, Type: EvEFIVariableDriverConfig, Data: variableData(guidImageSecurity, "dbx", hashList(dbxHashes))},
	)
}

// Separators appends an EV_SEPARATOR to each PCR, as firmware does before
// it hands over to boot applications.
func (l *EventLog) Separators(pcrs ...int) {
	for _, i := range pcrs {
		l.Add(Event{PCR: i, Type: EvSeparator, Data: []byte{0, 0, 0, 0}})
	}
}

// Authority appends the PCR 7 EV_EFI_VARIABLE_AUTHORITY event firmware
// logs when the db certificate c verifies an image.
func (l *EventLog) Authority(c *x509.Certificate) {
	sig := append(guidOwner[:], c.Raw...)
	l.Add(Event{PCR: 7, Type: EvEFIVariableAuthority, Data: variableData(guidImageSecurity, "db", sig)})
}

// BootApplication appends the PCR 4 measurement of an EFI image whose
// Authenticode hash is digest, loaded from path.
func (l *EventLog) BootApplication(digest []byte, path string) {
	l.Add(Event{PCR: 4, Type: EvEFIBootServicesApplication, Data: ImageLoadEvent(path), Digest: digest})
}

// Bytes is the log in the binary format of
// /sys/kernel/security/tpm0/binary_bios_measurements: the Spec ID event
// in the SHA-1 format, then TCG_PCR_EVENT2 structures (section 10.2).
func (l *EventLog) Bytes() []byte {
	le := binary.LittleEndian
	var spec []byte
	spec = append(spec, []byte("Spec ID Event03\x00")...)
	spec = le.AppendUint32(spec, 0) // platformClass
	spec = append(spec, 0, 2, 0, 2) // minor, major, errata, uintnSize
	spec = le.AppendUint32(spec, 1) // numberOfAlgorithms
	spec = le.AppendUint16(spec, uint16(tpm2.TPMAlgSHA256))
	spec = le.AppendUint16(spec, sha256.Size)
	spec = append(spec, 0) // vendorInfoSize

	var b []byte
	b = le.AppendUint32(b, 0)
	b = le.AppendUint32(b, EvNoAction)
	b = append(b, make([]byte, 20)...)
	b = le.AppendUint32(b, uint32(len(spec)))
	b = append(b, spec...)
	for _, e := range l.Events {
		b = le.AppendUint32(b, uint32(e.PCR))
		b = le.AppendUint32(b, e.Type)
		b = le.AppendUint32(b, 1)
		b = le.AppendUint16(b, uint16(tpm2.TPMAlgSHA256))
		b = append(b, e.digest()...)
		b = le.AppendUint32(b, uint32(len(e.Data)))
		b = append(b, e.Data...)
	}
	return b
}

// PCRs are the SHA-256 values of PCRs 0–7 a fresh TPM holds after
// extending the log's events.
func (l *EventLog) PCRs() map[int][]byte {
	m := map[int][]byte{}
	for i := range 8 {
		m[i] = make([]byte, sha256.Size)
	}
	for _, e := range l.Events {
		if e.Type == EvNoAction || e.PCR > 7 {
			continue
		}
		h := sha256.New()
		h.Write(m[e.PCR])
		h.Write(e.digest())
		m[e.PCR] = h.Sum(nil)
	}
	return m
}

// Extend extends the SHA-256 bank of the TPM behind tr with every event,
// as firmware measuring them does.
func (l *EventLog) Extend(t testing.TB, tr transport.TPM) {
	t.Helper()
	for _, e := range l.Events {
		if e.Type == EvNoAction {
			continue
		}
		if _, err := (tpm2.PCRExtend{
			PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(e.PCR), Auth: tpm2.PasswordAuth(nil)},
			Digests:   tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{{HashAlg: tpm2.TPMAlgSHA256, Digest: e.digest()}}},
		}).Execute(tr); err != nil {
			t.Fatalf("TPM2_PCR_Extend of PCR %d: %v", e.PCR, err)
		}
	}
}

// ExtendLog measures l into the swtpm, on a connection of its own that it
// closes before it returns (swtpm serves one at a time).
func (s *Swtpm) ExtendLog(t testing.TB, l *EventLog) {
	t.Helper()
	tr := s.raw(t)
	defer tr.Close()
	l.Extend(t, tr)
}

// raw opens a connection of its own to the swtpm's command port.
func (s *Swtpm) raw(t testing.TB) transport.TPMCloser {
	t.Helper()
	tr, err := tcp.Open(tcp.Config{
		CommandAddress:  net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)),
		PlatformAddress: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port+1)),
	})
	if err != nil {
		t.Fatalf("open swtpm: %v", err)
	}
	return tr
}

// variableData is a UEFI_VARIABLE_DATA (PC Client Platform Firmware
// Profile, section 10.2.6).
func variableData(guid [16]byte, name string, data []byte) []byte {
	le := binary.LittleEndian
	u := utf16.Encode([]rune(name))
	b := append([]byte{}, guid[:]...)
	b = le.AppendUint64(b, uint64(len(u)))
	b = le.AppendUint64(b, uint64(len(data)))
	for _, c := range u {
		b = le.AppendUint16(b, c)
	}
	return append(b, data...)
}

// certLists is one EFI_SIGNATURE_LIST of type EFI_CERT_X509_GUID per
// certificate (UEFI 2.10, section 32.4.1).
func certLists(certs []*x509.Certificate) []byte {
	var b []byte
	for _, c := range certs {
		b = appendSignatureList(b, guidCertX509, [][]byte{c.Raw})
	}
	return b
}

// hashList is one EFI_SIGNATURE_LIST of EFI_CERT_SHA256_GUID entries.
func hashList(hashes [][]byte) []byte {
	if len(hashes) == 0 {
		return nil
	}
	return appendSignatureList(nil, guidCertSHA256, hashes)
}

func appendSignatureList(b []byte, typ [16]byte, entries [][]byte) []byte {
	le := binary.LittleEndian
	size := 16 + len(entries[0])
	b = append(b, typ[:]...)
	b = le.AppendUint32(b, uint32(28+size*len(entries)))
	b = le.AppendUint32(b, 0)
	b = le.AppendUint32(b, uint32(size))
	for _, e := range entries {
		b = append(b, guidOwner[:]...)
		b = append(b, e...)
	}
	return b
}

// ImageLoadEvent is the data of an image's EV_EFI_BOOT_SERVICES_APPLICATION
// event: a UEFI_IMAGE_LOAD_EVENT whose device path is one media file path
// node of path, then the end node (section 10.2.3; UEFI 2.10, section
// 10.3.5.4).
func ImageLoadEvent(path string) []byte {
	le := binary.LittleEndian
	var name []byte
	for _, c := range utf16.Encode([]rune(path + "\x00")) {
		name = le.AppendUint16(name, c)
	}
	var dp []byte
	dp = append(dp, 0x04, 0x04)
	dp = le.AppendUint16(dp, uint16(4+len(name)))
	dp = append(dp, name...)
	dp = append(dp, 0x7F, 0xFF, 4, 0)
	b := make([]byte, 24)
	b = le.AppendUint64(b, uint64(len(dp)))
	return append(b, dp...)
}

// Reboot resets the swtpm as a platform reset does — PCRs back to their
// initial values, transient objects and sessions gone, seeds and NV kept —
// without restarting the process: CMD_INIT on its control port, then
// TPM2_Startup(CLEAR) as firmware sends it. Close every other connection
// first.
func (s *Swtpm) Reboot(t testing.TB) {
	t.Helper()
	ctrl, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port+1)))
	if err != nil {
		t.Fatalf("swtpm control port: %v", err)
	}
	defer ctrl.Close()
	// struct ptm_init: the command (CMD_INIT = 2) and init flags, both
	// big-endian; the answer is a 32-bit TPM result.
	if _, err := ctrl.Write([]byte{0, 0, 0, 2, 0, 0, 0, 0}); err != nil {
		t.Fatalf("swtpm CMD_INIT: %v", err)
	}
	var rc [4]byte
	if _, err := io.ReadFull(ctrl, rc[:]); err != nil {
		t.Fatalf("swtpm CMD_INIT: %v", err)
	}
	if binary.BigEndian.Uint32(rc[:]) != 0 {
		t.Fatalf("swtpm CMD_INIT: result %#x", rc)
	}
	tr := s.raw(t)
	defer tr.Close()
	if _, err := (tpm2.Startup{StartupType: tpm2.TPMSUClear}).Execute(tr); err != nil {
		t.Fatalf("TPM2_Startup after a reset: %v", err)
	}
}
