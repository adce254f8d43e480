// Package passmarker writes the boot's pass marker: the file the intake
// leaves after fleetd's verdict on this boot was a pass, and which the
// provision script (fleetd's internal/fleetd/provision) requires, beside
// the install code, before it wipes a disk. The marker names the device and
// the boot it is valid for, so a marker left from another boot or copied
// from another machine opens nothing.
//
// The format is text, one "key value" pair a line, so that the script
// reads it with bash alone (docs/install.md, "Provision script"):
//
//	nodetrust-boot-pass 1
//	uuid 6a1f5c1e-0000-4000-8000-000000000001
//	boot 0f8e2a51-6a43-4cfc-9a7c-52c2c4a3a1b9
//	verdict pass
//	time 2026-12-02T12:00:00Z
package passmarker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/internal/atomicfile"
	"github.com/nodetrust/nodetrust/pki"
)

// Where the marker and the boot id live on the install environment. /run
// is a tmpfs: the marker goes with the boot it was written for.
const (
	DefaultPath       = "/run/nodetrust/boot-pass"
	DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"
)

// Header is the marker's first line: the format and its version.
const Header = "nodetrust-boot-pass 1"

// MaxBytes bounds a marker file.
const MaxBytes = 512

// Marker is one boot's pass.
type Marker struct {
	// UUID is the device's product UUID, as declared.
	UUID string
	// BootID is the kernel's boot id of the boot that passed.
	BootID string
	// Time is when fleetd's verdict was received.
	Time time.Time
}

// Marshal returns the marker's text; the fields must be well formed.
func (m Marker) Marshal() ([]byte, error) {
	u, b := strings.ToLower(m.UUID), strings.ToLower(m.BootID)
	if !pki.IsCanonicalUUID(u) {
		return nil, fmt.Errorf("pass marker: the device UUID %.64q is not 8-4-4-4-12 hex", m.UUID)
	}
	if !pki.IsCanonicalUUID(b) {
		return nil, fmt.Errorf("pass marker: the boot id %.64q is not 8-4-4-4-12 hex", m.BootID)
	}
	if m.Time.IsZero() {
		return nil, errors.New("pass marker: no verdict time")
	}
	return fmt.Appendf(nil, "%s\nuuid %s\nboot %s\nverdict pass\ntime %s\n", Header, u, b, m.Time.UTC().Format(time.RFC3339)), nil
}

// Parse reads a marker's text, refusing anything Marshal would not write.
func Parse(data []byte) (Marker, error) {
	if len(data) > MaxBytes {
		return Marker{}, fmt.Errorf("pass marker: %d bytes, more than %d", len(data), MaxBytes)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 5 || lines[0] != Header || lines[3] != "verdict pass" {
		return Marker{}, errors.New("pass marker: not a nodetrust-boot-pass 1 file with verdict pass")
	}
	var m Marker
	var ok1, ok2, ok3 bool
	m.UUID, ok1 = strings.CutPrefix(lines[1], "uuid ")
	m.BootID, ok2 = strings.CutPrefix(lines[2], "boot ")
	ts, ok3 := strings.CutPrefix(lines[4], "time ")
	if !ok1 || !ok2 || !ok3 || !pki.IsCanonicalUUID(m.UUID) || !pki.IsCanonicalUUID(m.BootID) {
		return Marker{}, errors.New("pass marker: malformed uuid, boot or time line")
	}
	t, err := time.Parse(time.RFC3339, ts)
	if err != nil {
		return Marker{}, fmt.Errorf("pass marker: time: %w", err)
	}
	if t.UTC().Format(time.RFC3339) != ts {
		return Marker{}, fmt.Errorf("pass marker: time %q is not in UTC to the second (…Z)", ts)
	}
	m.Time = t
	return m, nil
}

// BootID reads the kernel's boot id from path (DefaultBootIDPath when
// empty).
func BootID(path string) (string, error) {
	if path == "" {
		path = DefaultBootIDPath
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if !pki.IsCanonicalUUID(id) {
		return "", fmt.Errorf("read the boot id: %s holds %.64q, not a boot id", path, id)
	}
	return id, nil
}

// Write writes m at path (DefaultPath when empty) atomically, mode 0600,
// making its directory (0700) when missing. The intake calls it only after
// fleetd's verdict on this boot was a pass.
func Write(path string, m Marker) error {
	if path == "" {
		path = DefaultPath
	}
	data, err := m.Marshal()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write the pass marker: %w", err)
	}
	return atomicfile.WriteFile(path, data, 0o600)
}
