package hwclaims

import (
	"bufio"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds of the claims.
const (
	MaxValueLen = 256 // bytes of each value, cut at a UTF-8 boundary
	MaxItems    = 64  // MACs and GPU UUIDs, each list
)

// maxFileLen bounds what is read of any one file.
const maxFileLen = 64 << 10

// Claims are the facts a host reports about itself. An empty string or a nil
// list means unknown.
type Claims struct {
	ProductUUID   string   // SMBIOS system UUID, lower case
	ProductSerial string   // SMBIOS system serial number
	BoardSerial   string   // SMBIOS baseboard serial number
	ChassisSerial string   // SMBIOS chassis serial number
	MACs          []string // permanent MACs of physical interfaces, lower case, sorted
	GPUUUIDs      []string // NVIDIA GPU UUIDs ("GPU-…"), sorted
	Hostname      string
	BootID        string // the kernel's boot id, lower case; new at every boot
}

// Identifiable reports whether the claims hold what the control plane's
// reclaim rules match a known machine by: a DMI product UUID or a serial.
// A machine without them (many VMs) is a new machine at every join unless
// its node is named.
func (c Claims) Identifiable() bool {
	return c.ProductUUID != "" || c.ProductSerial != "" || c.BoardSerial != "" || c.ChassisSerial != ""
}

// Read returns the claims of the host whose file system is at root; "" or "/"
// is this host. It reads, under root:
//
//   - sys/class/dmi/id/product_uuid, product_serial, board_serial and
//     chassis_serial;
//   - sys/class/net/*/address of each interface that has a device link
//     (a physical one) and whose addr_assign_type is 0 (a permanent address);
//   - the "GPU UUID:" lines of proc/driver/nvidia/gpus/*/information;
//   - the hostname: os.Hostname for this host, else root's etc/hostname;
//   - proc/sys/kernel/random/boot_id.
//
// Unreadable files and firmware placeholders give empty values, an all-zero
// MAC is skipped, and duplicates are reported once.
func Read(root string) Claims {
	host := root == "" || root == "/"
	if host {
		root = "/"
	}
	at := func(rel string) string { return filepath.Join(root, filepath.FromSlash(rel)) }
	dmi := func(name string) string { return firstLine(at("sys/class/dmi/id/" + name)) }

	c := Claims{
		ProductUUID:   productUUID(dmi("product_uuid")),
		ProductSerial: serial(dmi("product_serial")),
		BoardSerial:   serial(dmi("board_serial")),
		ChassisSerial: serial(dmi("chassis_serial")),
		MACs:          permanentMACs(at("sys/class/net")),
		GPUUUIDs:      gpuUUIDs(at("proc/driver/nvidia/gpus")),
		BootID:        strings.ToLower(firstLine(at("proc/sys/kernel/random/boot_id"))),
	}
	if host {
		if h, err := os.Hostname(); err == nil {
			c.Hostname = clean(h)
		}
	} else {
		c.Hostname = hostnameFile(at("etc/hostname"))
	}
	return c
}

// readLines returns the cleaned, non-empty lines of the start of the file at
// path, or nil when it cannot be read.
func readLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, maxFileLen))
	sc.Buffer(make([]byte, 4096), maxFileLen)
	for sc.Scan() {
		if l := clean(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// firstLine returns the first non-empty line of the file at path, cleaned.
func firstLine(path string) string {
	if lines := readLines(path); len(lines) > 0 {
		return lines[0]
	}
	return ""
}

// hostnameFile returns the name in an etc/hostname file: its first line that
// is not a comment.
func hostnameFile(path string) string {
	for _, l := range readLines(path) {
		if !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return ""
}

// clean drops invalid UTF-8 and control characters, trims space and cuts the
// value to MaxValueLen bytes.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && r != '\t' {
			return -1
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) > MaxValueLen {
		cut := MaxValueLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = strings.TrimSpace(s[:cut])
	}
	return s
}

// placeholders are what firmware writes when the vendor left a field unset,
// lower case.
var placeholders = map[string]bool{
	"":                         true,
	"none":                     true,
	"null":                     true,
	"unknown":                  true,
	"n/a":                      true,
	"na":                       true,
	"to be filled by o.e.m.":   true,
	"to be filled by oem":      true,
	"default string":           true,
	"not specified":            true,
	"not applicable":           true,
	"not available":            true,
	"system serial number":     true,
	"chassis serial number":    true,
	"base board serial number": true,
	"serial number":            true,
	"0123456789":               true,
	"123456789":                true,
	"1234567890":               true,
}

// serial returns v, or "" when v is a placeholder: a known phrase, or a run
// of one filler character such as "0", "00000000", "FFFFFFFF" or "........".
func serial(v string) string {
	l := strings.ToLower(v)
	if placeholders[l] {
		return ""
	}
	for _, filler := range []string{"0", "f", "x", ".", "-", "*", " "} {
		if strings.Trim(l, filler+" -") == "" {
			return ""
		}
	}
	return v
}

// placeholderUUIDs are product UUIDs that many boards of one vendor share
// because the field was never set.
var placeholderUUIDs = map[string]bool{
	"03000200-0400-0500-0006-000700080009": true,
}

// productUUID lower-cases the UUID, and returns "" for a placeholder: all
// zeros, all Fs, or a known shared value.
func productUUID(v string) string {
	v = strings.ToLower(v)
	if serial(v) == "" || placeholderUUIDs[v] {
		return ""
	}
	return v
}

// permanentMACs returns the permanent addresses of the physical interfaces
// under netDir (sys/class/net).
func permanentMACs(netDir string) []string {
	entries, err := os.ReadDir(netDir)
	if err != nil {
		return nil
	}
	var macs []string
	for _, e := range entries {
		dir := filepath.Join(netDir, e.Name())
		if _, err := os.Lstat(filepath.Join(dir, "device")); err != nil {
			continue // virtual: bridge, veth, tun, bond, loopback
		}
		if firstLine(filepath.Join(dir, "addr_assign_type")) != "0" {
			continue // random, stolen or set: not the hardware's
		}
		hw, err := net.ParseMAC(firstLine(filepath.Join(dir, "address")))
		if err != nil || allZero(hw) {
			continue
		}
		macs = append(macs, hw.String())
	}
	return bound(macs)
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// gpuUUIDs returns the UUIDs the NVIDIA driver reports under gpusDir
// (proc/driver/nvidia/gpus).
func gpuUUIDs(gpusDir string) []string {
	entries, err := os.ReadDir(gpusDir)
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range entries {
		if id := parseGPUInformation(readLines(filepath.Join(gpusDir, e.Name(), "information"))); id != "" {
			ids = append(ids, id)
		}
	}
	return bound(ids)
}

// parseGPUInformation returns the value of the "GPU UUID:" line, or "" when
// there is none or the driver has not read it yet ("GPU-????????-…").
func parseGPUInformation(lines []string) string {
	for _, l := range lines {
		k, v, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(k) != "GPU UUID" {
			continue
		}
		v = clean(v)
		if strings.Contains(v, "?") || serial(v) == "" {
			return ""
		}
		return v
	}
	return ""
}

// bound sorts the list, drops duplicates and keeps at most MaxItems.
func bound(list []string) []string {
	slices.Sort(list)
	list = slices.Compact(list)
	if len(list) > MaxItems {
		list = list[:MaxItems]
	}
	return slices.Clip(list)
}
