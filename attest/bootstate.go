package attest

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"strings"
	"unicode"
	"unicode/utf16"

	gattest "github.com/google/go-attestation/attest"
)

// Event types the boot state reads (TCG PC Client Platform Firmware
// Profile, section 10.4.1).
const (
	evSeparator               = 0x00000004
	evAction                  = 0x00000005
	evOmitBootDeviceEvents    = 0x00000012
	evEFIBootServicesApp      = 0x80000003
	evEFIAction               = 0x80000007
	evEFIVariableAuthority    = 0x800000E0
	maxBootApplicationPathLen = 256
)

// BootState is what a replayed measurement log says of how the machine
// booted: its Secure Boot configuration, the authorities that verified
// what it ran, and the code measured into PCR 4. Every field comes from
// events whose digests the replay verified; where an event's data is not
// covered by its digest the field says so.
type BootState struct {
	// SecureBootKnown is true when the log measures PCR 7 and PCR 7 was
	// replayed; the other Secure Boot fields are empty otherwise.
	SecureBootKnown bool
	// SecureBoot is the SecureBoot variable's value at boot.
	SecureBoot bool
	// PK, KEK, DB and DBX are the Secure Boot signature databases the
	// firmware measured into PCR 7 before its separator.
	PK, KEK, DB, DBX SignatureDatabase
	// DriverAuthorities verified code before the PCR 7 separator (option
	// ROMs and drivers), in log order, each once.
	DriverAuthorities []Authority
	// Authorities verified boot applications after the PCR 7 separator:
	// the firmware's db entries and the authorities shim logs (its vendor
	// certificate, MokList entries), in log order, each once.
	Authorities []Authority

	// PCR4Known is true when PCR 4 was replayed; BootApplications is empty
	// otherwise.
	PCR4Known bool
	// BootApplications are PCR 4's measurements of code, in log order:
	// every PCR 4 event but a separator or action string whose digest is
	// the SHA-256 of its data. The first is usually the boot loader (shim,
	// systemd-boot) and the last the kernel or unified kernel image that
	// took over ([BootState.Kernel]).
	BootApplications []BootApplication
}

// SignatureDatabase is one Secure Boot variable of EFI_SIGNATURE_LISTs
// (UEFI 2.10, section 32.4.1): certificates and image hashes.
type SignatureDatabase struct {
	Certificates []Authority
	// Hashes counts the entries that are hashes rather than certificates.
	Hashes int
}

// Authority is a certificate the firmware or shim used to verify code,
// logged as an EV_EFI_VARIABLE_AUTHORITY event, or one held in a
// signature database.
type Authority struct {
	Certificate *x509.Certificate
	// SHA256 is the SHA-256 of the certificate's DER: the way a policy
	// names it.
	SHA256 [sha256.Size]byte
}

// BootApplication is one measurement of code into PCR 4.
type BootApplication struct {
	// Type is the event's type name, EV_EFI_BOOT_SERVICES_APPLICATION for
	// an image the firmware or shim loaded. The type is not covered by
	// the digest: it only labels the measurement.
	Type string
	// Digest is what PCR 4 was extended with: for an EFI image, the
	// SHA-256 Authenticode hash of the PE/COFF file (UEFI 2.10, section
	// 32.2.4), the same whatever signs it.
	Digest [sha256.Size]byte
	// Path is the file path of the image's device path, when the event's
	// data carries one (UEFI_IMAGE_LOAD_EVENT). It is a hint only: the
	// digest does not cover it. At most 256 characters, control
	// characters replaced.
	Path string
	// Authorities are the authorities logged in PCR 7 after the previous
	// boot application and before this one: the ones that verified it.
	// The firmware logs each authority once per boot, so an image verified
	// by an authority already used has none here.
	Authorities []Authority
}

// Kernel returns the last boot application, the kernel or unified kernel
// image the boot chain ended with, or nil when PCR 4 has none.
func (b *BootState) Kernel() *BootApplication {
	if len(b.BootApplications) == 0 {
		return nil
	}
	return &b.BootApplications[len(b.BootApplications)-1]
}

// BootState summarises the replayed log. It reads only events whose
// replay was verified, and trusts an event's data only where its digest
// covers it: Secure Boot variables and authorities (checked by
// go-attestation's ParseSecurebootState during the replay), PCR 4's
// separators and action strings (checked here). Any other PCR 4 event is
// a measurement of code whatever its type says, so a log cannot hide an
// image by labelling it as something else.
func (l *EventLog) BootState() *BootState {
	out := &BootState{PCR4Known: l.replayed[4]}
	if sb := l.SecureBoot; sb != nil {
		out.SecureBootKnown = true
		out.SecureBoot = sb.Enabled
		out.PK = signatureDatabase(sb.PlatformKeys, sb.PlatformKeyHashes)
		out.KEK = signatureDatabase(sb.ExchangeKeys, sb.ExchangeKeyHashes)
		out.DB = signatureDatabase(sb.PermittedKeys, sb.PermittedHashes)
		out.DBX = signatureDatabase(sb.ForbiddenKeys, sb.ForbiddenHashes)
	}

	var (
		separator7 bool
		pending    []Authority // authorities logged since the last boot application
		seen       = map[[sha256.Size]byte]bool{}
		seenDriver = map[[sha256.Size]byte]bool{}
	)
	for _, e := range l.Events {
		switch e.Index {
		case 7:
			if l.SecureBoot == nil {
				continue
			}
			switch uint32(e.Type) {
			case evSeparator:
				separator7 = true
			case evEFIVariableAuthority:
				certs := l.SecureBoot.PostSeparatorAuthority
				if !separator7 {
					certs = l.SecureBoot.PreSeparatorAuthority
				}
				for _, a := range authoritiesIn(e.Data, certs) {
					if !separator7 {
						if !seenDriver[a.SHA256] {
							seenDriver[a.SHA256] = true
							out.DriverAuthorities = append(out.DriverAuthorities, a)
						}
						continue
					}
					pending = append(pending, a)
					if !seen[a.SHA256] {
						seen[a.SHA256] = true
						out.Authorities = append(out.Authorities, a)
					}
				}
			}
		case 4:
			if informational(e) {
				continue
			}
			app := BootApplication{Type: e.Type.String(), Authorities: pending}
			copy(app.Digest[:], e.Digest)
			if uint32(e.Type) == evEFIBootServicesApp {
				app.Path = imageLoadPath(e.Data)
			}
			pending = nil
			out.BootApplications = append(out.BootApplications, app)
		}
	}
	return out
}

// informational reports whether a PCR 4 event measures a string rather
// than code: a separator, an action or the omission of boot device
// events, whose digest is the SHA-256 of its data.
func informational(e gattest.Event) bool {
	switch uint32(e.Type) {
	case evSeparator, evAction, evEFIAction, evOmitBootDeviceEvents:
		d := sha256.Sum256(e.Data)
		return bytes.Equal(d[:], e.Digest)
	}
	return false
}

// authoritiesIn returns the certificates of certs, which
// ParseSecurebootState read from the log's authority events, that the
// authority event data holds.
func authoritiesIn(data []byte, certs []x509.Certificate) []Authority {
	var out []Authority
	for i := range certs {
		if bytes.Contains(data, certs[i].Raw) {
			out = append(out, authorityOf(&certs[i]))
		}
	}
	return out
}

func authorityOf(c *x509.Certificate) Authority {
	return Authority{Certificate: c, SHA256: sha256.Sum256(c.Raw)}
}

func signatureDatabase(certs []x509.Certificate, hashes [][]byte) SignatureDatabase {
	db := SignatureDatabase{Hashes: len(hashes)}
	for i := range certs {
		db.Certificates = append(db.Certificates, authorityOf(&certs[i]))
	}
	return db
}

// imageLoadPath returns the file path in the device path of a
// UEFI_IMAGE_LOAD_EVENT (PC Client Platform Firmware Profile, section
// 10.2.3): four 64-bit fields (location, length and link-time address of
// the image, length of the device path), then the device path (UEFI 2.10,
// section 10.3), whose media file path nodes (type 4, subtype 4) hold
// UTF-16 path names. It returns "" when data holds no such node; a
// malformed device path ends the walk.
func imageLoadPath(data []byte) string {
	const header = 32
	if len(data) < header {
		return ""
	}
	n := binary.LittleEndian.Uint64(data[24:32])
	dp := data[header:]
	if n < uint64(len(dp)) {
		dp = dp[:n]
	}
	var b strings.Builder
	for len(dp) >= 4 {
		typ, sub, size := dp[0], dp[1], int(binary.LittleEndian.Uint16(dp[2:4]))
		if size < 4 || size > len(dp) || typ == 0x7F {
			break
		}
		if typ == 0x04 && sub == 0x04 {
			name := decodeUTF16(dp[4:size])
			if b.Len() > 0 && !strings.HasSuffix(b.String(), `\`) && !strings.HasPrefix(name, `\`) {
				b.WriteByte('\\')
			}
			b.WriteString(name)
			if b.Len() > 4*maxBootApplicationPathLen {
				break
			}
		}
		dp = dp[size:]
	}
	return sanitize(b.String(), maxBootApplicationPathLen)
}

// decodeUTF16 decodes a little-endian UTF-16 string up to its NUL.
func decodeUTF16(b []byte) string {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		c := binary.LittleEndian.Uint16(b[i:])
		if c == 0 {
			break
		}
		u = append(u, c)
	}
	return string(utf16.Decode(u))
}

// sanitize caps s at max runes and replaces control characters, so that a
// value the node chose can be logged and printed safely.
func sanitize(s string, max int) string {
	var b strings.Builder
	n := 0
	for _, r := range s {
		if n == max {
			b.WriteString("…")
			break
		}
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			r = '?'
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}
