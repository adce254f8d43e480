package inventory

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var classes = []string{"worker", "control-plane", "install-environment"}

const pinA = "sha256:0000000000000000000000000000000000000000000000000000000000000001"

const good = `version: 1
nodes:
  - name: web-01
    serial: SN-0001
    product_uuid: 6A1F5C1E-0000-4000-8000-000000000001
    macs: ["02:00:00:00:00:0B", "02:00:00:00:00:0a"]
    class: worker
    site: rack1
    role: web
    expected_port: {chassis: sw-01, port: ge-0/0/1}
    install_disk: /dev/disk/by-id/nvme-eui.0001
    ek_binding:
      pins: [` + pinA + `]
      source: receiving-scan
      reference: "scan 2026-03-01 #42"
  - name: cp-01
    product_uuid: 6a1f5c1e-0000-4000-8000-000000000002
    class: control-plane
`

func TestParseReadsADeclaration(t *testing.T) {
	ds, err := Parse([]byte(good), classes)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 {
		t.Fatalf("%d declarations", len(ds))
	}
	d := ds[0]
	want := store.Declaration{Name: "web-01", Serial: "SN-0001", ProductUUID: "6a1f5c1e-0000-4000-8000-000000000001",
		MACs: []string{"02:00:00:00:00:0a", "02:00:00:00:00:0b"}, Class: "worker", Site: "rack1", Role: "web",
		SwitchChassis: "sw-01", SwitchPort: "ge-0/0/1", InstallDisk: "/dev/disk/by-id/nvme-eui.0001", EKPins: []string{pinA}, EKSource: SourceReceivingScan, EKReference: "scan 2026-03-01 #42"}
	if fmt.Sprintf("%+v", d) != fmt.Sprintf("%+v", want) {
		t.Errorf("got  %+v\nwant %+v", d, want)
	}
}

func TestParseListsEveryErrorByLine(t *testing.T) {
	bad := `version: 2
extra: x
nodes:
  - name: Web_01
    class: gpu
    serial: SN-1
  - name: web-02
    serial: SN-1
    class: worker
    macs: [zz]
    colour: blue
  - name: web-03
    class: worker
    ek_binding:
      pins: [sha256:nothex]
      source: the machine said so
  - name: web-04
    class: worker
    product_uuid: not-a-uuid
    expected_port: {chassis: sw-1}
  - class: worker
    serial: SN-5
  - name: web-06
    class: worker
    serial: SN-6
    install_disk: sda
`
	_, err := Parse([]byte(bad), classes)
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("Parse: %v, want a ParseError", err)
	}
	for _, want := range []string{
		`line 1: version "2" is not supported`,
		`line 2: unknown key "extra"`,
		`line 4: name: node id "Web_01"`,
		`line 5: class "gpu" is not one of worker, control-plane, install-environment`,
		`line 8: serial "SN-1" is declared twice (first at line 6)`,
		`line 10: MAC "zz" is not six colon-separated hex bytes`,
		`line 11: unknown key "colour" in a node`,
		`line 15: EK pin "sha256:nothex"`,
		`line 16: ek_binding source "the machine said so" is not receiving-scan or supplier-record`,
		`line 12: node "web-03" needs a serial or a product_uuid`,
		`line 19: product_uuid "not-a-uuid" is not a UUID`,
		`line 20: expected_port needs both chassis and port`,
		`line 21: a node needs a name`,
		`line 26: install_disk must be a device path under /dev/`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the errors do not say %q:\n%v", want, err)
		}
	}
	if !strings.Contains(err.Error(), "nothing was changed") {
		t.Errorf("the error does not say nothing changed: %v", err)
	}
}

func TestParseRefusesWholeFiles(t *testing.T) {
	for name, data := range map[string]string{
		"not YAML":         "version: 1\nnodes: [\n",
		"empty":            "",
		"a list":           "- a\n",
		"no version":       "nodes: []\n",
		"nodes not a list": "version: 1\nnodes: {a: b}\n",
		"too large":        strings.Repeat("#", MaxFileBytes+1),
	} {
		if _, err := Parse([]byte(data), classes); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if ds, err := Parse([]byte("version: 1\nnodes:\n"), classes); err != nil || len(ds) != 0 {
		t.Errorf("an empty list: %v, %v", ds, err)
	}
}

// Sample returns an inventory file of n workers, each with an EK binding.
func Sample(n int) []byte {
	var b strings.Builder
	b.WriteString("version: 1\nnodes:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: node-%04d\n    serial: SN-%06d\n    product_uuid: 6a1f5c1e-0000-4000-8000-%012x\n    macs: [\"02:00:00:%02x:%02x:01\"]\n    class: worker\n    site: rack%d\n    role: worker\n    expected_port: {chassis: sw-%d, port: ge-0/0/%d}\n    ek_binding:\n      pins: [\"sha256:%064x\"]\n      source: supplier-record\n",
			i, i, i, i/256, i%256, i/40, i/48, i%48, i+1)
	}
	return []byte(b.String())
}

func TestPlanOfAThousandMachinesIsIdempotentAndRecordsEveryWriter(t *testing.T) {
	ds, err := Parse(Sample(1000), classes)
	if err != nil {
		t.Fatal(err)
	}
	w := Writer{Name: "alice", Role: roles.Declarer}
	now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	p := MakePlan(nil, nil, ds, w, now, "req-1", nil)
	if p.Added != 1000 || len(p.Writes) != 1000 || p.Updated != 0 {
		t.Fatalf("first plan: %d added, %d writes", p.Added, len(p.Writes))
	}
	// Every field set in the file has a changelog entry naming its writer.
	if len(p.Changes) != 1000*10 {
		t.Errorf("%d changes, want 10 per machine", len(p.Changes))
	}
	for _, c := range p.Changes {
		if c.Actor != "alice" || c.ActorRole != "declarer" || c.RequestID != "req-1" || !c.Time.Equal(now) {
			t.Fatalf("change without its writer: %+v", c)
		}
	}
	// Applied, the same file plans nothing.
	var current []store.Declaration
	for _, wr := range p.Writes {
		d := wr.Declaration
		d.Version = wr.PrevVersion + 1
		current = append(current, d)
	}
	again := MakePlan(current, nil, ds, w, now.Add(time.Hour), "req-2", nil)
	if !again.Empty() || len(again.Changes) != 0 || again.Unchanged != 1000 {
		t.Errorf("second plan: %d writes, %d changes, %d unchanged", len(again.Writes), len(again.Changes), again.Unchanged)
	}
}

func TestPlanWarnsOfBindingsThatAuthorizeNothing(t *testing.T) {
	ds, err := Parse([]byte(good), classes)
	if err != nil {
		t.Fatal(err)
	}
	p := MakePlan(nil, map[string]string{"cp-01": store.StateRetired}, ds, Writer{Name: "root", Role: roles.Owner}, time.Now(), "r", nil)
	if p.Added != 1 || p.Retired != 1 || len(p.Writes) != 1 {
		t.Fatalf("plan: %+v", p)
	}
	if w := p.Devices[0].Warnings; len(w) != 1 || !strings.Contains(w[0], "not by a declarer: it will authorize nothing") {
		t.Errorf("warnings of an owner-written binding: %q", w)
	}
	if w := p.Devices[1].Warnings; len(w) != 1 || !strings.Contains(w[0], "comes back only declared under a new name") {
		t.Errorf("warnings of a retired entry: %q", w)
	}
	missing := MakePlan(ds, nil, ds[:1], Writer{Name: "alice", Role: roles.Declarer}, time.Now(), "r", nil)
	if missing.Missing != 1 || missing.Devices[1].Kind != KindMissing || !missing.Empty() {
		t.Errorf("a declaration left out of the file: %+v", missing)
	}
}

func TestBindingAuthority(t *testing.T) {
	ch := func(field, actor, role string) store.FieldChange {
		return store.FieldChange{Field: field, New: "x", Actor: actor, ActorRole: role}
	}
	for _, tt := range []struct {
		name    string
		changes []store.FieldChange // newest first
		want    bool
		why     string
	}{
		{"written by a declarer", []store.FieldChange{ch(FieldEKPins, "alice", "declarer"), ch(FieldEKSource, "alice", "declarer")}, true, "declarer alice"},
		{"written by the owner", []store.FieldChange{ch(FieldEKPins, "root", "owner"), ch(FieldEKSource, "root", "owner")}, false, "root (role owner)"},
		{"changed by the owner after a declarer wrote it", []store.FieldChange{ch(FieldEKPins, "root", "owner"), ch(FieldEKPins, "alice", "declarer")}, false, "root (role owner)"},
		{"its source changed by another credential", []store.FieldChange{ch(FieldEKSource, "bob", "owner"), ch(FieldEKPins, "alice", "declarer")}, false, "ek_binding.source"},
		{"other fields by the owner", []store.FieldChange{ch(FieldSite, "root", "owner"), ch(FieldEKPins, "alice", "declarer")}, true, ""},
		{"never written", []store.FieldChange{ch(FieldSite, "alice", "declarer")}, false, "no EK binding"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := BindingAuthority("web-01", tt.changes)
			if a.Honoured != tt.want || !strings.Contains(a.Why, tt.why) {
				t.Errorf("BindingAuthority = %+v, want honoured %t and %q", a, tt.want, tt.why)
			}
		})
	}
}

// A declarer who applies a binding another credential wrote makes it its
// own: the fields are recorded again with the declarer as writer.
func TestADeclarerReaffirmsABindingItDidNotWrite(t *testing.T) {
	ds, err := Parse([]byte(good), classes)
	if err != nil {
		t.Fatal(err)
	}
	owner := MakePlan(nil, nil, ds, Writer{Name: "root", Role: roles.Owner}, time.Unix(0, 0), "r1", nil)
	var current []store.Declaration
	for _, wr := range owner.Writes {
		d := wr.Declaration
		d.Version = 1
		current = append(current, d)
	}
	alice := Writer{Name: "alice", Role: roles.Declarer}
	p := MakePlan(current, nil, ds, alice, time.Unix(1, 0), "r2", map[string]bool{"web-01": true})
	if p.Updated != 1 || p.Unchanged != 1 || len(p.Changes) != 3 {
		t.Fatalf("plan: %d updated, %d unchanged, %d changes", p.Updated, p.Unchanged, len(p.Changes))
	}
	all := append(append([]store.FieldChange{}, p.Changes...), owner.Changes...) // newest first
	if a := BindingAuthority("web-01", all); !a.Honoured {
		t.Errorf("after the declarer's apply: %+v", a)
	}
	if again := MakePlan(current, nil, ds, alice, time.Unix(2, 0), "r3", nil); !again.Empty() {
		t.Errorf("once reaffirmed, the same file plans %d changes", len(again.Changes))
	}
}
