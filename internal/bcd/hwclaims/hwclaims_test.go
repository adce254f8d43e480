package hwclaims

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// put writes content at rel under root, creating directories.
func put(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// nic adds an interface to the fake sysfs. physical gives it a device link
// (dangling, as a fake tree has no devices), assign is its addr_assign_type
// ("" for none).
func nic(t *testing.T, root, name, addr, assign string, physical bool) {
	t.Helper()
	dir := "sys/class/net/" + name
	put(t, root, dir+"/address", addr+"\n")
	if assign != "" {
		put(t, root, dir+"/addr_assign_type", assign+"\n")
	}
	if physical {
		link := filepath.Join(root, filepath.FromSlash(dir), "device")
		if err := os.Symlink("../../../devices/pci0000:00/0000:00:03.0", link); err != nil {
			t.Fatal(err)
		}
	}
}

func gpu(t *testing.T, root, bus, uuid string) {
	t.Helper()
	put(t, root, "proc/driver/nvidia/gpus/"+bus+"/information",
		"Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 140\nGPU UUID: \t "+uuid+"\nVideo BIOS: \t 92.00.36.00.04\n")
}

func TestReadEmptyTree(t *testing.T) {
	if got := Read(t.TempDir()); !isZero(got) {
		t.Errorf("Read of an empty tree = %+v, want nothing", got)
	}
}

func isZero(c Claims) bool {
	return c.ProductUUID == "" && c.ProductSerial == "" && c.BoardSerial == "" && c.ChassisSerial == "" &&
		c.MACs == nil && c.GPUUUIDs == nil && c.Hostname == "" && c.BootID == ""
}

func TestReadDMI(t *testing.T) {
	tests := []struct {
		name            string
		uuid, serial    string // file contents; "-" for no file
		wantUUID, wantS string
	}{
		{"values", "4C4C4544-0042-3510-8052-B4C04F4E3132\n", "  7XK2Q53 \n", "4c4c4544-0042-3510-8052-b4c04f4e3132", "7XK2Q53"},
		{"missing files", "-", "-", "", ""},
		{"empty", "\n", "\n", "", ""},
		{"all-zero UUID", "00000000-0000-0000-0000-000000000000\n", "0\n", "", ""},
		{"all-F UUID", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF\n", "None\n", "", ""},
		{"shared placeholder UUID", "03000200-0400-0500-0006-000700080009\n", "To Be Filled By O.E.M.\n", "", ""},
		{"placeholder serials", "-", "Default string\n", "", ""},
		{"not specified", "-", "Not Specified\n", "", ""},
		{"system serial number", "-", "System Serial Number\n", "", ""},
		{"filler run", "-", "........\n", "", ""},
		{"zeros run", "-", "00000000\n", "", ""},
		{"control characters dropped", "-", "AB\x00C\x07D\n", "", "ABCD"},
		{"serial that only looks odd", "-", "0F0F\n", "", "0F0F"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.uuid != "-" {
				put(t, root, "sys/class/dmi/id/product_uuid", tt.uuid)
			}
			if tt.serial != "-" {
				for _, f := range []string{"product_serial", "board_serial", "chassis_serial"} {
					put(t, root, "sys/class/dmi/id/"+f, tt.serial)
				}
			}
			got := Read(root)
			if got.ProductUUID != tt.wantUUID {
				t.Errorf("ProductUUID = %q, want %q", got.ProductUUID, tt.wantUUID)
			}
			if got.ProductSerial != tt.wantS || got.BoardSerial != tt.wantS || got.ChassisSerial != tt.wantS {
				t.Errorf("serials = %q, %q, %q, want %q", got.ProductSerial, got.BoardSerial, got.ChassisSerial, tt.wantS)
			}
		})
	}
}

func TestReadDMIDistinctSerials(t *testing.T) {
	root := t.TempDir()
	put(t, root, "sys/class/dmi/id/product_serial", "P1\n")
	put(t, root, "sys/class/dmi/id/board_serial", "B1\n")
	put(t, root, "sys/class/dmi/id/chassis_serial", "C1\n")
	got := Read(root)
	if got.ProductSerial != "P1" || got.BoardSerial != "B1" || got.ChassisSerial != "C1" {
		t.Errorf("serials = %q, %q, %q", got.ProductSerial, got.BoardSerial, got.ChassisSerial)
	}
}

func TestReadUnreadableIsSkipped(t *testing.T) {
	root := t.TempDir()
	put(t, root, "sys/class/dmi/id/product_uuid", "4c4c4544-0042-3510-8052-b4c04f4e3132\n")
	// A directory cannot be read as a file, whoever runs the test.
	if err := os.MkdirAll(filepath.Join(root, "sys/class/dmi/id/board_serial"), 0o755); err != nil {
		t.Fatal(err)
	}
	put(t, root, "sys/class/dmi/id/product_serial", "SECRET\n")
	if os.Geteuid() != 0 {
		// As on a real host for a user who is not root.
		if err := os.Chmod(filepath.Join(root, "sys/class/dmi/id/product_serial"), 0o000); err != nil {
			t.Fatal(err)
		}
	}
	got := Read(root)
	if got.BoardSerial != "" {
		t.Errorf("BoardSerial = %q, want empty", got.BoardSerial)
	}
	if os.Geteuid() != 0 && got.ProductSerial != "" {
		t.Errorf("ProductSerial = %q from an unreadable file", got.ProductSerial)
	}
	if got.ProductUUID == "" {
		t.Error("a readable value was lost beside unreadable ones")
	}
}

func TestReadValueCap(t *testing.T) {
	root := t.TempDir()
	put(t, root, "sys/class/dmi/id/product_serial", strings.Repeat("A", 1000)+"\n")
	// A two-byte rune straddling the cap.
	put(t, root, "sys/class/dmi/id/board_serial", strings.Repeat("B", MaxValueLen-1)+"é\n")
	put(t, root, "etc/hostname", strings.Repeat("h", 5000)+"\n")
	got := Read(root)
	if got.ProductSerial != strings.Repeat("A", MaxValueLen) {
		t.Errorf("ProductSerial has %d bytes, want %d", len(got.ProductSerial), MaxValueLen)
	}
	if got.BoardSerial != strings.Repeat("B", MaxValueLen-1) || !utf8.ValidString(got.BoardSerial) {
		t.Errorf("BoardSerial = %q, want it cut before the rune", got.BoardSerial)
	}
	if len(got.Hostname) != MaxValueLen {
		t.Errorf("Hostname has %d bytes, want %d", len(got.Hostname), MaxValueLen)
	}
}

func TestReadMACs(t *testing.T) {
	root := t.TempDir()
	nic(t, root, "eth0", "3C:EC:EF:12:34:56", "0", true)
	nic(t, root, "eno1", "00:25:90:aa:bb:cc", "0", true)
	nic(t, root, "eth1", "3c:ec:ef:12:34:56", "0", true)  // the same MAC again
	nic(t, root, "wlan0", "de:ad:be:ef:00:01", "1", true) // random
	nic(t, root, "eth2", "de:ad:be:ef:00:02", "3", true)  // set by user space
	nic(t, root, "eth3", "de:ad:be:ef:00:03", "", true)   // no addr_assign_type
	nic(t, root, "eth4", "00:00:00:00:00:00", "0", true)  // no address
	nic(t, root, "eth5", "not-a-mac", "0", true)
	nic(t, root, "veth9", "de:ad:be:ef:00:04", "0", false) // virtual
	nic(t, root, "lo", "00:00:00:00:00:00", "0", false)
	nic(t, root, "br0", "de:ad:be:ef:00:05", "3", false)

	want := []string{"00:25:90:aa:bb:cc", "3c:ec:ef:12:34:56"}
	if got := Read(root).MACs; !slices.Equal(got, want) {
		t.Errorf("MACs = %v, want %v", got, want)
	}
}

func TestReadMACsBounded(t *testing.T) {
	root := t.TempDir()
	for i := MaxItems + 6; i > 0; i-- {
		nic(t, root, fmt.Sprintf("eth%d", i), fmt.Sprintf("02:00:00:00:%02x:%02x", i/256, i%256), "0", true)
	}
	got := Read(root).MACs
	if len(got) != MaxItems || !slices.IsSorted(got) || got[0] != "02:00:00:00:00:01" {
		t.Errorf("MACs = %d sorted=%v first=%q, want the %d smallest", len(got), slices.IsSorted(got), got[0], MaxItems)
	}
}

func TestReadGPUs(t *testing.T) {
	root := t.TempDir()
	gpu(t, root, "0000:c1:00.0", "GPU-f3a1c7e2-9b4d-4e1a-8c2f-0d6b5a4e3c21")
	gpu(t, root, "0000:41:00.0", "GPU-1d0a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8")
	gpu(t, root, "0000:81:00.0", "GPU-????????-????-????-????-????????????") // not read yet
	gpu(t, root, "0000:01:00.0", "GPU-1d0a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8") // duplicate
	put(t, root, "proc/driver/nvidia/gpus/0000:02:00.0/information", "Model: \t\t NVIDIA T4\n")
	if err := os.MkdirAll(filepath.Join(root, "proc/driver/nvidia/gpus/0000:03:00.0"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := []string{"GPU-1d0a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8", "GPU-f3a1c7e2-9b4d-4e1a-8c2f-0d6b5a4e3c21"}
	if got := Read(root).GPUUUIDs; !slices.Equal(got, want) {
		t.Errorf("GPUUUIDs = %v, want %v", got, want)
	}
}

func TestReadGPUsBounded(t *testing.T) {
	root := t.TempDir()
	for i := range MaxItems + 3 {
		gpu(t, root, fmt.Sprintf("0000:%02x:00.0", i), fmt.Sprintf("GPU-%08x-0000-0000-0000-000000000001", i))
	}
	if got := Read(root).GPUUUIDs; len(got) != MaxItems || !slices.IsSorted(got) {
		t.Errorf("%d GPU UUIDs, sorted=%v; want %d", len(got), slices.IsSorted(got), MaxItems)
	}
}

func TestReadHostnameAndBootID(t *testing.T) {
	root := t.TempDir()
	put(t, root, "etc/hostname", "# written by the installer\n\n  node-17.lab.example  \n")
	put(t, root, "proc/sys/kernel/random/boot_id", "340BD0A8-BE8E-4248-868B-4A7E610BA7EC\n")
	got := Read(root)
	if got.Hostname != "node-17.lab.example" {
		t.Errorf("Hostname = %q", got.Hostname)
	}
	if got.BootID != "340bd0a8-be8e-4248-868b-4a7e610ba7ec" {
		t.Errorf("BootID = %q", got.BootID)
	}
}

func TestReadThisHost(t *testing.T) {
	for _, root := range []string{"/", ""} {
		got := Read(root)
		if got.BootID == "" || got.Hostname == "" {
			t.Errorf("Read(%q) = %+v, want a boot id and a hostname", root, got)
		}
		want, err := os.Hostname()
		if err != nil {
			t.Fatal(err)
		}
		if got.Hostname != want {
			t.Errorf("Read(%q).Hostname = %q, want os.Hostname's %q", root, got.Hostname, want)
		}
		for _, m := range got.MACs {
			if m == "00:00:00:00:00:00" || m != strings.ToLower(m) {
				t.Errorf("Read(%q) reports MAC %q", root, m)
			}
		}
	}
}

func FuzzParseGPUInformation(f *testing.F) {
	f.Add("Model: \t\t NVIDIA A100\nGPU UUID: \t GPU-1d0a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8\n")
	f.Add("GPU UUID:\n")
	f.Add("GPU UUID: " + strings.Repeat("é", 300))
	f.Fuzz(func(t *testing.T, info string) {
		var lines []string
		for l := range strings.Lines(info) {
			if l = clean(l); l != "" {
				lines = append(lines, l)
			}
		}
		got := parseGPUInformation(lines)
		if len(got) > MaxValueLen || !utf8.ValidString(got) || got != strings.TrimSpace(got) {
			t.Fatalf("parseGPUInformation gave %q", got)
		}
	})
}

func TestIdentifiable(t *testing.T) {
	for _, tc := range []struct {
		c    Claims
		want bool
	}{
		{Claims{}, false},
		{Claims{Hostname: "vm-1", MACs: []string{"52:54:00:12:34:56"}, BootID: "b"}, false},
		{Claims{ProductUUID: "6a1f5c1e-0000-4000-8000-000000000001"}, true},
		{Claims{ChassisSerial: "CZ1234"}, true},
	} {
		if got := tc.c.Identifiable(); got != tc.want {
			t.Errorf("%+v.Identifiable() = %v, want %v", tc.c, got, tc.want)
		}
	}
}
