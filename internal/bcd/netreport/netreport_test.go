package netreport

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki/netreport"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseLLDPCtlFixtures(t *testing.T) {
	sw01 := netreport.Neighbor{Interface: "nt-eth0", ChassisName: "sw-01", ChassisIDType: "mac", ChassisID: "6a:d7:ab:dc:5d:e9",
		PortIDType: "ifname", PortID: "nt-swp1", PortDescr: "uplink to node-01"}
	second := netreport.Neighbor{Interface: "nt-eth1", ChassisName: "sw-01", ChassisIDType: "mac", ChassisID: "6a:d7:ab:dc:5d:e9",
		PortIDType: "ifname", PortID: "nt-swp2", PortDescr: "nt-swp2"}
	cases := []struct {
		file string
		want []netreport.Neighbor
	}{
		{"lldpctl-one.json", []netreport.Neighbor{sw01}},
		{"lldpctl-two.json", []netreport.Neighbor{sw01, second}},
		{"lldpctl-none.json", nil},
		{"lldpctl-macport.json", []netreport.Neighbor{{Interface: "nt-eth0", ChassisName: "sw-01", ChassisIDType: "mac", ChassisID: "6a:d7:ab:dc:5d:e9",
			PortIDType: "mac", PortID: "6a:d7:ab:dc:5d:e9", PortDescr: "uplink to node-01"}}},
		{"lldpctl-unnamed-chassis.json", []netreport.Neighbor{{Interface: "eno1", ChassisIDType: "local", ChassisID: "FOC1234X0AB",
			PortIDType: "local", PortID: "Gi1/0/17"}}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			got, err := ParseLLDPCtl(readFixture(t, c.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %d neighbours %+v, want %d", len(got), got, len(c.want))
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("neighbour %d:\n got %+v\nwant %+v", i, got[i], c.want[i])
				}
			}
		})
	}
}

func TestParseLLDPCtlRefuses(t *testing.T) {
	cases := map[string]string{
		"not json":              `lldp.eth0.via=LLDP`,
		"no lldp object":        `{"interface": {}}`,
		"no chassis":            `{"lldp": {"interface": {"eth0": {"port": {"id": {"type": "ifname", "value": "p1"}}}}}}`,
		"no port":               `{"lldp": {"interface": {"eth0": {"chassis": {"sw": {"id": {"type": "mac", "value": "aa"}}}}}}}`,
		"no chassis id":         `{"lldp": {"interface": {"eth0": {"chassis": {"sw": {"descr": "x"}}, "port": {"id": {"value": "p1"}}}}}}`,
		"empty port id":         `{"lldp": {"interface": {"eth0": {"chassis": {"id": {"value": "aa"}}, "port": {"id": {"type": "ifname", "value": " "}}}}}}`,
		"port id not an object": `{"lldp": {"interface": {"eth0": {"chassis": {"id": {"value": "aa"}}, "port": {"id": "p1"}}}}}`,
		"descr not a string":    `{"lldp": {"interface": {"eth0": {"chassis": {"id": {"value": "aa"}}, "port": {"id": {"value": "p1"}, "descr": 7}}}}}`,
		"long port id":          `{"lldp": {"interface": {"eth0": {"chassis": {"id": {"value": "aa"}}, "port": {"id": {"value": "` + strings.Repeat("p", netreport.MaxField+1) + `"}}}}}}`,
		"control character":     `{"lldp": {"interface": {"eth0": {"chassis": {"id": {"value": "a\u0007a"}}, "port": {"id": {"value": "p1"}}}}}}`,
	}
	for name, in := range cases {
		if ns, err := ParseLLDPCtl([]byte(in)); err == nil {
			t.Errorf("%s: parsed %+v, want an error", name, ns)
		}
	}
	if _, err := ParseLLDPCtl(make([]byte, MaxInput+1)); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("oversized input: %v", err)
	}
}

func TestChoose(t *testing.T) {
	two, err := ParseLLDPCtl(readFixture(t, "lldpctl-two.json"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := Choose(two, "nt-eth1")
	if err != nil || n.PortID != "nt-swp2" {
		t.Fatalf("Choose nt-eth1: %+v, %v", n, err)
	}
	if _, err := Choose(two, ""); err == nil || !strings.Contains(err.Error(), "nt-eth0, nt-eth1") {
		t.Fatalf("Choose without an interface among two: %v, want one listing both", err)
	}
	if _, err := Choose(two, "eth9"); err == nil || !strings.Contains(err.Error(), "heard on: nt-eth0, nt-eth1") {
		t.Fatalf("Choose an interface without a neighbour: %v", err)
	}
	if _, err := Choose(nil, ""); err == nil || !strings.Contains(err.Error(), "no LLDP neighbour") {
		t.Fatalf("Choose among none: %v", err)
	}
	dup := []netreport.Neighbor{two[0], two[0]}
	dup[1].PortID = "other"
	if _, err := Choose(dup, "nt-eth0"); err == nil || !strings.Contains(err.Error(), "2 LLDP neighbours heard on nt-eth0") {
		t.Fatalf("Choose with two neighbours on one interface: %v", err)
	}
}

// Build from a file, then sign with a device key and verify: what the
// node sends is what fleetd checks.
func TestBuildFromFileSignVerify(t *testing.T) {
	now := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	rep, err := Build(t.Context(), Reader{File: filepath.Join("testdata", "lldpctl-one.json")}, "", now)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ChassisName != "sw-01" || rep.PortID != "nt-swp1" || !rep.ObservedAt.Equal(now) {
		t.Fatalf("report %+v", rep)
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := netreport.Sign(rep, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(&k.PublicKey); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(t.Context(), Reader{File: filepath.Join("testdata", "lldpctl-none.json")}, "", now); err == nil {
		t.Fatal("Build made a report from an input without neighbours")
	}
	if _, err := Build(t.Context(), Reader{File: filepath.Join(t.TempDir(), "missing.json")}, "", now); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Build from a missing file: %v", err)
	}
}

func needCommand(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing: CI needs it (coreutils; lldpd via make deps)", name)
		}
		t.Skipf("%s is not installed", name)
	}
}

// The command path, run with real programs: one that prints lldpctl's
// output, one that never stops printing, one that never ends, lldpctl
// itself without a daemon to ask, and a program that is not there.
func TestReaderRunsCommand(t *testing.T) {
	needCommand(t, "cat")
	needCommand(t, "yes")
	needCommand(t, "sleep")
	ns, err := Reader{Command: []string{"cat", filepath.Join("testdata", "lldpctl-two.json")}}.Neighbors(t.Context())
	if err != nil || len(ns) != 2 {
		t.Fatalf("neighbours from cat: %+v, %v", ns, err)
	}
	if _, err := (Reader{Command: []string{"yes"}}).Neighbors(t.Context()); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("endless output: %v, want the bound's error", err)
	}
	_, err = Reader{Command: []string{"sleep", "600"}, Timeout: 50 * time.Millisecond}.Neighbors(t.Context())
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not finish") {
		t.Fatalf("a command that never ends: %v, want its deadline", err)
	}
	_, err = Reader{Command: []string{"nodetrust-no-such-lldpctl"}}.Neighbors(t.Context())
	if err == nil || !strings.Contains(err.Error(), "is not installed (install lldpd") {
		t.Fatalf("a missing command: %v", err)
	}
	needCommand(t, "lldpctl")
	_, err = Reader{Command: []string{"lldpctl", "-u", filepath.Join(t.TempDir(), "no.socket"), "-f", "json"}}.Neighbors(t.Context())
	if err == nil || !strings.Contains(err.Error(), "is lldpd running?") {
		t.Fatalf("lldpctl without lldpd: %v", err)
	}
}

func FuzzParseLLDPCtl(f *testing.F) {
	for _, name := range []string{"lldpctl-one.json", "lldpctl-two.json", "lldpctl-none.json", "lldpctl-macport.json", "lldpctl-unnamed-chassis.json"} {
		f.Add(readFixture(f, name))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ns, err := ParseLLDPCtl(data)
		if err != nil {
			return
		}
		if len(ns) > MaxNeighbors {
			t.Fatalf("%d neighbours, more than %d", len(ns), MaxNeighbors)
		}
		for _, n := range ns {
			if err := n.Check(); err != nil {
				t.Fatalf("parsed a neighbour a report refuses: %+v: %v", n, err)
			}
		}
	})
}
