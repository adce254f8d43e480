// Package netreport is the signed network report a node sends with its
// request for installation (seed 003, "Attestation and admission"): the
// switch chassis and port its interface saw over LLDP, and when, signed by
// the device key that its LDevID certifies. The node (bcd) builds and signs
// it; fleetd verifies it and compares it with the declared expected port.
//
// The signature protects the report in transit. LLDP itself authenticates
// nothing: a report says what the machine saw, not where the cable is.
package netreport

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nodetrust/nodetrust/pki"
)

// Label starts the data whose SHA-256 a report's signature covers, so a
// signature over a report is never valid for anything else the device
// key signs.
const Label = "nodetrust network-report v1"

// Bounds of a report.
const (
	// MaxField bounds each text field, in bytes.
	MaxField = 256
	// MaxEncoded bounds a signed report's JSON form.
	MaxEncoded = 8 << 10
)

// Neighbor is one LLDP neighbour of one interface, as lldpctl prints it.
type Neighbor struct {
	// Interface is the local interface that heard the neighbour.
	Interface string `json:"interface"`
	// ChassisName is the switch's system name (may be empty).
	ChassisName string `json:"chassis_name,omitempty"`
	// ChassisIDType and ChassisID are the chassis ID TLV: its subtype as
	// lldpctl names it ("mac", "local", "ifname", …) and its value.
	ChassisIDType string `json:"chassis_id_type,omitempty"`
	ChassisID     string `json:"chassis_id"`
	// PortIDType and PortID are the port ID TLV ("ifname", "mac",
	// "local", …); PortDescr is the port description TLV.
	PortIDType string `json:"port_id_type,omitempty"`
	PortID     string `json:"port_id"`
	PortDescr  string `json:"port_descr,omitempty"`
}

// Report is one observation: the neighbour an interface saw, and when.
type Report struct {
	Neighbor
	ObservedAt time.Time `json:"observed_at"`
}

// Signed is a report with the device key's signature: IEEE P1363 (r||s)
// over Digest(r), and the key's pin as its kid.
type Signed struct {
	Report    Report `json:"report"`
	KeyID     string `json:"kid"`
	Signature []byte `json:"sig"`
}

// fields are the neighbour's text fields in their canonical order, each
// with its name for messages.
func (n Neighbor) fields() [][2]string {
	return [][2]string{
		{"interface", n.Interface},
		{"chassis_name", n.ChassisName},
		{"chassis_id_type", n.ChassisIDType},
		{"chassis_id", n.ChassisID},
		{"port_id_type", n.PortIDType},
		{"port_id", n.PortID},
		{"port_descr", n.PortDescr},
	}
}

// Check reports the first malformed field of n: every text field at most
// MaxField bytes of printable UTF-8, and an interface, a chassis id and a
// port id present.
func (n Neighbor) Check() error {
	for _, f := range n.fields() {
		if err := checkText(f[0], f[1]); err != nil {
			return err
		}
	}
	switch {
	case n.Interface == "":
		return errors.New("network report: no interface")
	case n.ChassisID == "":
		return errors.New("network report: no chassis id")
	case n.PortID == "":
		return errors.New("network report: no port id")
	}
	return nil
}

// Check reports the first malformed field of r: its neighbour's (see
// Neighbor.Check), then an observation time present and in range.
func (r Report) Check() error {
	if err := r.Neighbor.Check(); err != nil {
		return err
	}
	switch {
	case r.ObservedAt.IsZero():
		return errors.New("network report: no observation time")
	case r.ObservedAt.Year() < 1970 || r.ObservedAt.Year() > 2200:
		return fmt.Errorf("network report: observation time %s is out of range", r.ObservedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

func checkText(name, s string) error {
	if len(s) > MaxField {
		return fmt.Errorf("network report: %s is %d bytes, more than %d", name, len(s), MaxField)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("network report: %s is not UTF-8", name)
	}
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return fmt.Errorf("network report: %s holds the unprintable character %U", name, c)
		}
	}
	return nil
}

// Canonical is the byte string a report's digest covers: Label, 0x00, then
// each text field in a fixed order as a 4-byte big-endian length and its
// bytes, then the observation time as 8-byte big-endian Unix nanoseconds.
// Two reports have the same encoding only when every field is equal.
func (r Report) Canonical() []byte {
	b := make([]byte, 0, 256)
	b = append(b, Label...)
	b = append(b, 0)
	for _, f := range r.fields() {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f[1])))
		b = append(b, f[1]...)
	}
	return binary.BigEndian.AppendUint64(b, uint64(r.ObservedAt.UnixNano()))
}

// Digest is SHA-256 of r's canonical encoding.
func Digest(r Report) []byte {
	d := sha256.Sum256(r.Canonical())
	return d[:]
}

// Sign checks r and signs it with the device key (an ECDSA key; in a
// TPM, behind crypto.Signer).
func Sign(r Report, device crypto.Signer) (Signed, error) {
	if err := r.Check(); err != nil {
		return Signed{}, err
	}
	if device == nil {
		return Signed{}, errors.New("sign the network report: no device key")
	}
	pin, err := pki.PinOf(device.Public())
	if err != nil {
		return Signed{}, fmt.Errorf("sign the network report: %w", err)
	}
	sig, err := pki.SignP1363(device, Digest(r))
	if err != nil {
		return Signed{}, fmt.Errorf("sign the network report: %w", err)
	}
	return Signed{Report: r, KeyID: pin.String(), Signature: sig}, nil
}

// ErrSignature is a report whose signature or kid does not match the
// device key.
var ErrSignature = errors.New("network report: the signature is not the device key's")

// Verify checks s's fields and that the device key pub signed it. It
// checks nothing about the report's age or content: that is the
// verifier's policy.
func (s Signed) Verify(pub crypto.PublicKey) error {
	if err := s.Report.Check(); err != nil {
		return err
	}
	ec, ok := pub.(*ecdsa.PublicKey)
	if !ok || ec == nil {
		return fmt.Errorf("network report: the device key is %T, want ECDSA", pub)
	}
	pin, err := pki.PinOf(ec)
	if err != nil {
		return fmt.Errorf("network report: %w", err)
	}
	if s.KeyID != pin.String() {
		return fmt.Errorf("%w (kid %.80q, device key %s)", ErrSignature, s.KeyID, pin)
	}
	if !pki.VerifyP1363(ec, Digest(s.Report), s.Signature) {
		return ErrSignature
	}
	return nil
}

// Marshal returns s's JSON form, the form it travels and is stored in.
func (s Signed) Marshal() ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode the network report: %w", err)
	}
	return b, nil
}

// Unmarshal reads a signed report's JSON form (at most MaxEncoded bytes)
// and checks its fields; the caller still verifies the signature.
func Unmarshal(b []byte) (Signed, error) {
	if len(b) > MaxEncoded {
		return Signed{}, fmt.Errorf("network report: %d bytes, more than %d", len(b), MaxEncoded)
	}
	var s Signed
	if err := json.Unmarshal(b, &s); err != nil {
		return Signed{}, fmt.Errorf("network report: %w", err)
	}
	if err := s.Report.Check(); err != nil {
		return Signed{}, err
	}
	return s, nil
}
