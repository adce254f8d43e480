package attest_test

import (
	"testing"
	"unicode/utf8"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// FuzzBootState feeds arbitrary event types and data to the boot state's
// reading of PCR 4: the image load event's device path above all, which
// the node chooses freely (its digest does not cover it). The boot state
// must not panic, must list every measurement of code, and must keep an
// image's path short and printable.
func FuzzBootState(f *testing.F) {
	f.Add(uint32(evEFIBootServicesApp), tpmtest.ImageLoadEvent(`\EFI\BOOT\BOOTX64.EFI`))
	f.Add(uint32(evEFIBootServicesApp), make([]byte, 40))
	f.Add(uint32(evEFIBootServicesApp), []byte{})
	f.Add(uint32(0x80000007), []byte("Calling EFI Application from Boot Option"))
	f.Add(uint32(evSeparator), []byte{0, 0, 0, 0})
	f.Add(uint32(0x0000000D), []byte("grub_cmd linux"))
	long := tpmtest.ImageLoadEvent(string(make([]rune, 600)))
	f.Add(uint32(evEFIBootServicesApp), long)
	f.Fuzz(func(t *testing.T, typ uint32, data []byte) {
		events := []logEvent{
			{pcr: 7, typ: evSeparator, data: []byte{0, 0, 0, 0}},
			{pcr: 4, typ: typ, data: data, digest: make([]byte, 32)},
		}
		if typ == evNoAction {
			return // not extended: nothing to replay
		}
		el, err := attest.ReplayEventLog(buildEventLog(events), replayLog(events))
		if err != nil {
			return
		}
		bs := el.BootState()
		if len(bs.BootApplications) != 1 {
			t.Fatalf("a measurement whose digest is not its data's gave %d boot applications", len(bs.BootApplications))
		}
		p := bs.BootApplications[0].Path
		if n := utf8.RuneCountInString(p); n > 257 || !utf8.ValidString(p) {
			t.Fatalf("path of %d runes, valid UTF-8 %v", n, utf8.ValidString(p))
		}
		for _, r := range p {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("control character %U in the path", r)
			}
		}
	})
}

// TestBootStatePCR4 checks how PCR 4's events are read: an image's path
// from its device path, strings that are what they measure skipped, and
// anything else a measurement of code whatever its type.
func TestBootStatePCR4(t *testing.T) {
	action := []byte("Calling EFI Application from Boot Option")
	events := []logEvent{
		{pcr: 7, typ: evSeparator, data: []byte{0, 0, 0, 0}},
		{pcr: 4, typ: 0x80000007, data: action},
		{pcr: 4, typ: evSeparator, data: []byte{0, 0, 0, 0}},
		{pcr: 4, typ: evEFIBootServicesApp, data: tpmtest.ImageLoadEvent(`\EFI\BOOT\BOOTX64.EFI`), digest: bytesOf(0x11)},
		// An image labelled as an action: its digest is not its data's.
		{pcr: 4, typ: 0x80000007, data: action, digest: bytesOf(0x22)},
		{pcr: 4, typ: evEFIBootServicesApp, data: make([]byte, 40), digest: bytesOf(0x33)},
	}
	el, err := attest.ReplayEventLog(buildEventLog(events), replayLog(events))
	if err != nil {
		t.Fatal(err)
	}
	bs := el.BootState()
	if !bs.SecureBootKnown || bs.SecureBoot || len(bs.Authorities) != 0 {
		t.Fatalf("Secure Boot known %v on %v with %d authorities", bs.SecureBootKnown, bs.SecureBoot, len(bs.Authorities))
	}
	if len(bs.BootApplications) != 3 {
		t.Fatalf("%d boot applications, want 3: %+v", len(bs.BootApplications), bs.BootApplications)
	}
	for i, want := range []struct {
		typ, path string
		digest    byte
	}{
		{"EV_EFI_BOOT_SERVICES_APPLICATION", `\EFI\BOOT\BOOTX64.EFI`, 0x11},
		{"EV_EFI_ACTION", "", 0x22},
		{"EV_EFI_BOOT_SERVICES_APPLICATION", "", 0x33},
	} {
		a := bs.BootApplications[i]
		if a.Type != want.typ || a.Path != want.path || a.Digest[0] != want.digest {
			t.Errorf("boot application %d: %s %q %x, want %s %q %x", i, a.Type, a.Path, a.Digest[0], want.typ, want.path, want.digest)
		}
	}
	if k := bs.Kernel(); k == nil || k.Digest[0] != 0x33 {
		t.Errorf("Kernel() = %+v", k)
	}

	t.Run("PCR 4 not replayed", func(t *testing.T) {
		all := replayLog(events)
		el, err := attest.ReplayEventLog(buildEventLog(events), map[int][]byte{7: all[7]})
		if err != nil {
			t.Fatal(err)
		}
		if bs := el.BootState(); bs.PCR4Known || len(bs.BootApplications) != 0 || bs.Kernel() != nil {
			t.Fatalf("PCR 4 known %v with %d boot applications", bs.PCR4Known, len(bs.BootApplications))
		}
	})
}

func bytesOf(b byte) []byte {
	out := make([]byte, 32)
	for i := range out {
		out[i] = b
	}
	return out
}
