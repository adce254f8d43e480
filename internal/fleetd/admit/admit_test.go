package admit

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
	"github.com/nodetrust/nodetrust/pki/netreport"
)

const (
	ekA = "sha256:aaaa000000000000000000000000000000000000000000000000000000000001"
	ekB = "sha256:bbbb000000000000000000000000000000000000000000000000000000000002"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func openStore(t *testing.T) store.Store {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// declare writes d as a credential of role writes it.
func declare(t *testing.T, s store.Store, role roles.Role, d store.Declaration) {
	t.Helper()
	p := inventory.MakePlan(nil, nil, []store.Declaration{d}, inventory.Writer{Name: "alice", Role: role}, now.Add(-time.Hour), "req", nil)
	if err := s.ApplyInventory(t.Context(), store.InventoryWrite{Writes: p.Writes, Changes: p.Changes}); err != nil {
		t.Fatal(err)
	}
}

// complete is a declaration with every required field.
func complete(name, class string) store.Declaration {
	return store.Declaration{Name: name, Serial: "SN-" + name, ProductUUID: "6a1f5c1e-0000-4000-8000-000000000001", Class: class, Site: "rack1",
		SwitchChassis: "sw-01", SwitchPort: "ge-0/0/1", EKPins: []string{ekA}, EKSource: inventory.SourceReceivingScan, EKReference: "scan #1", InstallDisk: "/dev/nvme0n1"}
}

// withRole is d with its declared role set to role.
func withRole(d store.Declaration, role string) store.Declaration {
	d.Role = role
	return d
}

// report is what the machine on sw-01 ge-0/0/1 sees, observed at.
func report(at time.Time) netreport.Report {
	return netreport.Report{Neighbor: netreport.Neighbor{Interface: "eth0", ChassisName: "SW-01", ChassisIDType: "mac", ChassisID: "6a:d7:ab:dc:5d:e9",
		PortIDType: "ifname", PortID: "ge-0/0/1 ", PortDescr: "uplink"}, ObservedAt: at}
}

func signed(t *testing.T, k *ecdsa.PrivateKey, r netreport.Report) *netreport.Signed {
	t.Helper()
	s, err := netreport.Sign(r, k)
	if err != nil {
		t.Fatal(err)
	}
	return &s
}

// failingSource is an inventory that cannot answer (NetBox down).
type failingSource struct{ inventory.Source }

var errDown = errors.New("netbox: connection refused")

func (failingSource) Name() string { return "netbox" }
func (failingSource) Get(context.Context, string) (store.Declaration, error) {
	return store.Declaration{}, errDown
}

func TestDecide(t *testing.T) {
	device, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	good := func(t *testing.T) *netreport.Signed { return signed(t, device, report(now.Add(-time.Minute))) }

	type setup func(t *testing.T, s store.Store, m *lifecycle.Manager)
	declared := func(d store.Declaration) setup {
		return func(t *testing.T, s store.Store, _ *lifecycle.Manager) { declare(t, s, roles.Declarer, d) }
	}
	provisionedBy := func(d store.Declaration, actor string) setup {
		return func(t *testing.T, s store.Store, m *lifecycle.Manager) {
			declare(t, s, roles.Declarer, d)
			if actor == AutoActor {
				// As the lifecycle's auto-provision writes it.
				gen, err := s.NextGeneration(t.Context(), d.Name)
				if err != nil {
					t.Fatal(err)
				}
				_, _, err = s.TransitionNode(t.Context(), store.Transition{NodeID: d.Name, From: []string{store.StatePlanned}, To: store.StateProvisioning,
					Create: &store.Node{ID: d.Name, Class: d.Class, Role: d.Class, State: store.StatePlanned, Generation: gen},
					Time:   now.Add(-time.Hour), Actor: AutoActor, Reason: "auto-provision"})
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if _, err := m.Provision(t.Context(), d.Name, actor, "first install", "req-1"); err != nil {
				t.Fatal(err)
			}
		}
	}
	without := func(edit func(*store.Declaration)) store.Declaration {
		d := complete("web-01", lifecycle.ClassWorker)
		edit(&d)
		return d
	}

	cases := []struct {
		name   string
		setup  setup
		source func(s store.Store) inventory.Source
		auto   bool
		req    func(t *testing.T) Request
		// want is the refusing rule and field; "" admits.
		want      Rule
		wantField string
		// wantAuto says the decision carries an auto-provision.
		wantAuto bool
	}{
		{name: "worker auto-provision", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, wantAuto: true},
		{name: "worker without auto-provision", setup: declared(complete("web-01", lifecycle.ClassWorker)), want: RuleProvision},
		{name: "install environment never auto-provisioned", setup: declared(complete("web-01", lifecycle.ClassInstallEnvironment)), auto: true, want: RuleProvision},
		{name: "control plane planned, auto on", setup: declared(complete("web-01", lifecycle.ClassControlPlane)), auto: true, want: RuleControlPlane},
		{name: "control plane auto-provisioned", setup: provisionedBy(complete("web-01", lifecycle.ClassControlPlane), AutoActor), auto: true, want: RuleControlPlane},
		{name: "worker class declared with a control-plane role, auto on", setup: declared(withRole(complete("web-01", lifecycle.ClassWorker), lifecycle.ClassControlPlane)), auto: true, want: RuleControlPlane},
		{name: "control plane explicit provision", setup: provisionedBy(complete("web-01", lifecycle.ClassControlPlane), "admin:owner")},
		{name: "worker unfinished provision", setup: provisionedBy(complete("web-01", lifecycle.ClassWorker), AutoActor)},
		{name: "worker explicit provision", setup: provisionedBy(complete("web-01", lifecycle.ClassWorker), "admin:owner")},
		{name: "not declared", setup: func(*testing.T, store.Store, *lifecycle.Manager) {}, auto: true, want: RuleDeclared},
		{name: "inventory unavailable", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true,
			source: func(store.Store) inventory.Source { return failingSource{} }, want: RuleInventory},
		{name: "missing serial and uuid", setup: declared(without(func(d *store.Declaration) { d.Serial, d.ProductUUID = "", "" })), auto: true,
			want: RuleComplete, wantField: "serial or product_uuid"},
		{name: "missing expected chassis", setup: declared(without(func(d *store.Declaration) { d.SwitchChassis, d.SwitchPort = "", "" })), auto: true,
			want: RuleComplete, wantField: inventory.FieldSwitchChassis},
		{name: "missing install disk", setup: declared(without(func(d *store.Declaration) { d.InstallDisk = "" })), auto: true,
			want: RuleComplete, wantField: inventory.FieldInstallDisk},
		{name: "missing EK binding", setup: declared(without(func(d *store.Declaration) { d.EKPins, d.EKSource, d.EKReference = nil, "", "" })), auto: true,
			want: RuleComplete, wantField: inventory.FieldEKPins},
		{name: "binding by the owner", auto: true, want: RuleBinding, wantField: inventory.FieldEKPins,
			setup: func(t *testing.T, s store.Store, _ *lifecycle.Manager) {
				declare(t, s, roles.Owner, complete("web-01", lifecycle.ClassWorker))
			}},
		{name: "another EK", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, want: RuleBinding, wantField: inventory.FieldEKPins,
			req: func(t *testing.T) Request {
				return Request{Device: "web-01", EKPin: ekB, DeviceKey: &device.PublicKey, Report: good(t), Now: now}
			}},
		{name: "already active", auto: true, want: RuleState,
			setup: func(t *testing.T, s store.Store, m *lifecycle.Manager) {
				provisionedBy(complete("web-01", lifecycle.ClassWorker), "admin:owner")(t, s, m)
				if _, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "web-01", From: []string{store.StateProvisioning}, To: store.StateActive,
					Time: now, Actor: "fleetd", Reason: "config released"}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "no report: a certificate alone", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, want: RuleReportMissing,
			req: func(t *testing.T) Request {
				return Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Now: now}
			}},
		{name: "report signed by another key", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, want: RuleReportSignature,
			req: func(t *testing.T) Request {
				return Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: signed(t, other, report(now)), Now: now}
			}},
		{name: "report altered after signing", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, want: RuleReportSignature,
			req: func(t *testing.T) Request {
				s := good(t)
				s.Report.PortID = "ge-0/0/1"
				s.Report.ObservedAt = now
				return Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: s, Now: now}
			}},
		{name: "report too old", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, want: RuleReportAge, wantField: "observed_at",
			req: func(t *testing.T) Request {
				return Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: signed(t, device, report(now.Add(-16*time.Minute))), Now: now}
			}},
		{name: "report from the future", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, want: RuleReportFuture, wantField: "observed_at",
			req: func(t *testing.T) Request {
				return Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: signed(t, device, report(now.Add(3*time.Minute))), Now: now}
			}},
		{name: "report within the skew", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, wantAuto: true,
			req: func(t *testing.T) Request {
				return Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: signed(t, device, report(now.Add(time.Minute))), Now: now}
			}},
		{name: "port mismatch", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, want: RulePort, wantField: inventory.FieldSwitchPort,
			req: func(t *testing.T) Request {
				r := report(now)
				r.PortID = "ge-0/0/2"
				return Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: signed(t, device, r), Now: now}
			}},
		{name: "chassis mismatch", setup: declared(complete("web-01", lifecycle.ClassWorker)), auto: true, want: RulePort, wantField: inventory.FieldSwitchChassis,
			req: func(t *testing.T) Request {
				r := report(now)
				r.ChassisName = "sw-02"
				return Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: signed(t, device, r), Now: now}
			}},
		{name: "chassis declared by MAC", auto: true, wantAuto: true,
			setup: declared(without(func(d *store.Declaration) { d.SwitchChassis = "6A-D7-AB-DC-5D-E9" }))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t)
			src := inventory.Source(inventory.StoreSource{Store: s})
			m := &lifecycle.Manager{Store: s, Source: src, TrustDomain: "example.org", Now: func() time.Time { return now.Add(-30 * time.Minute) }}
			c.setup(t, s, m)
			if c.source != nil {
				src = c.source(s)
			}
			a := &Admitter{Source: src, Nodes: s, AutoProvision: c.auto}
			req := Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: good(t), Now: now}
			if c.req != nil {
				req = c.req(t)
			}
			dec, err := a.Decide(t.Context(), req)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if dec.Decl.Name != "web-01" || dec.Authority == "" || dec.Report.PortID == "" {
					t.Fatalf("decision %+v", dec)
				}
				if got := dec.Provision != nil; got != c.wantAuto {
					t.Fatalf("decision's auto-provision %v, want %v", dec.Provision, c.wantAuto)
				}
				if c.wantAuto && (dec.Provision.Actor != AutoActor || dec.Provision.To != store.StateProvisioning || dec.From != store.StatePlanned) {
					t.Fatalf("auto-provision %+v from %s", dec.Provision, dec.From)
				}
				return
			}
			var rf *Refusal
			if !errors.As(err, &rf) {
				t.Fatalf("error %v (%T), want a refusal by rule %s", err, err, c.want)
			}
			if rf.Rule != c.want || rf.Field != c.wantField {
				t.Fatalf("refused by rule %s field %q, want rule %s field %q: %v", rf.Rule, rf.Field, c.want, c.wantField, rf)
			}
			if !strings.Contains(rf.Error(), string(c.want)) || (c.wantField != "" && !strings.Contains(rf.Error(), c.wantField)) {
				t.Fatalf("the server's text %q does not name the rule and field", rf.Error())
			}
			if !strings.HasPrefix(rf.Wire(), "Install refused: ") || len(rf.Wire()) < len("Install refused: ")+10 {
				t.Fatalf("wire text %q says nothing to do", rf.Wire())
			}
			// The wire text does not echo what the inventory declares.
			for _, secret := range []string{"sw-01", "ge-0/0/1", ekA, ekB} {
				if strings.Contains(rf.Wire(), secret) {
					t.Fatalf("wire text %q shows the inventory's %q", rf.Wire(), secret)
				}
			}
			if c.want == RuleInventory && (!errors.Is(err, lifecycle.ErrSourceUnavailable) || !errors.Is(err, errDown)) {
				t.Fatalf("an unavailable inventory's refusal does not wrap ErrSourceUnavailable and its cause: %v", err)
			}
		})
	}
}

// The bounds are the Admitter's settings.
func TestReportBoundsConfigurable(t *testing.T) {
	device, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	declare(t, s, roles.Declarer, complete("web-01", lifecycle.ClassWorker))
	a := &Admitter{Source: inventory.StoreSource{Store: s}, Nodes: s, AutoProvision: true, MaxReportAge: time.Hour, MaxSkew: time.Second}
	old := Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: signed(t, device, report(now.Add(-50*time.Minute))), Now: now}
	if _, err := a.Decide(t.Context(), old); err != nil {
		t.Fatalf("a 50-minute-old report within MaxReportAge 1h: %v", err)
	}
	ahead := old
	ahead.Report = signed(t, device, report(now.Add(time.Minute)))
	var rf *Refusal
	if _, err := a.Decide(t.Context(), ahead); !errors.As(err, &rf) || rf.Rule != RuleReportFuture {
		t.Fatalf("a report a minute ahead with MaxSkew 1s: %v", err)
	}
}

func TestRequiredListsEveryField(t *testing.T) {
	d := complete("web-01", lifecycle.ClassWorker)
	if f := Missing(d); f != "" {
		t.Fatalf("a complete declaration lacks %s", f)
	}
	for _, r := range Required {
		if r.Missing(d) {
			t.Errorf("Required's %s reports a complete declaration as missing it", r.Field)
		}
		if r.Missing(store.Declaration{Name: "x"}) != true {
			t.Errorf("Required's %s finds it in an empty declaration", r.Field)
		}
	}
}

func TestNormalizeAndMatch(t *testing.T) {
	for in, want := range map[string]string{
		"6A:D7:AB:DC:5D:E9":        "6a:d7:ab:dc:5d:e9",
		"6a-d7-ab-dc-5d-e9":        "6a:d7:ab:dc:5d:e9",
		"6ad7.abdc.5de9":           "6a:d7:ab:dc:5d:e9",
		"6AD7ABDC5DE9":             "6a:d7:ab:dc:5d:e9",
		"  GigabitEthernet1/0/17 ": "gigabitethernet1/0/17",
		"Port  17":                 "port 17",
		"ge-0/0/1":                 "ge-0/0/1",
	} {
		if got := Normalize(in); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
	r := report(now)
	r.PortIDType, r.PortID, r.PortDescr = "mac", "6a:d7:ab:dc:5d:01", "Ge-0/0/1"
	if !PortMatches("ge-0/0/1", r) {
		t.Error("a port declared by name does not match the description of a port sent by MAC")
	}
	if PortMatches("", r) || ChassisMatches("", r) {
		t.Error("an empty declaration matches")
	}
	if PortMatches("Gi1/0/17", netreport.Report{Neighbor: netreport.Neighbor{PortID: "GigabitEthernet1/0/17"}}) {
		t.Error("an abbreviation matched the full name: names compare as the switch sends them")
	}
}

// A source that answers the declaration but not who wrote its binding is
// unavailable too; a failing node store is an error, not a decision.
func TestSourceAndStoreFailures(t *testing.T) {
	device, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	declare(t, s, roles.Declarer, complete("web-01", lifecycle.ClassWorker))
	f := storefault.New(s)
	a := &Admitter{Source: inventory.StoreSource{Store: f}, Nodes: f, AutoProvision: true}
	req := Request{Device: "web-01", EKPin: ekA, DeviceKey: &device.PublicKey, Report: signed(t, device, report(now)), Now: now}

	f.FailAt("ListChanges", 1, errDown)
	_, err = a.Decide(t.Context(), req)
	var rf *Refusal
	if !errors.As(err, &rf) || rf.Rule != RuleInventory || !errors.Is(err, lifecycle.ErrSourceUnavailable) {
		t.Fatalf("the binding's changelog unavailable: %v, want a refusal by %s", err, RuleInventory)
	}

	f.FailAt("GetNode", 1, errDown)
	_, err = a.Decide(t.Context(), req)
	if errors.As(err, &rf) || !errors.Is(err, errDown) {
		t.Fatalf("a failing node store: %v, want its error and no refusal", err)
	}

	if _, err := a.Decide(t.Context(), req); err != nil {
		t.Fatalf("with the store answering again: %v", err)
	}
}
