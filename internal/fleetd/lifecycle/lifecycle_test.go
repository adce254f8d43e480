package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
)

const (
	ekA = "sha256:aaaa000000000000000000000000000000000000000000000000000000000001"
	ekB = "sha256:bbbb000000000000000000000000000000000000000000000000000000000002"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func openStore(t *testing.T) store.Store {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// declare writes d as the admin name of role writes it.
func declare(t *testing.T, s store.Store, name, role string, d store.Declaration) {
	t.Helper()
	cur, err := s.GetDeclaration(t.Context(), d.Name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	var curs []store.Declaration
	if err == nil {
		curs = []store.Declaration{cur}
	}
	p := inventory.MakePlan(curs, nil, []store.Declaration{d}, inventory.Writer{Name: name, Role: roleOf(role)}, t0, "req", nil)
	if err := s.ApplyInventory(t.Context(), store.InventoryWrite{Writes: p.Writes, Changes: p.Changes}); err != nil {
		t.Fatal(err)
	}
}

func worker(name string, pins ...string) store.Declaration {
	d := store.Declaration{Name: name, Serial: "SN-" + name, ProductUUID: "uuid-" + name, Class: ClassWorker, Site: "rack1"}
	if len(pins) > 0 {
		d.EKPins, d.EKSource = pins, inventory.SourceReceivingScan
	}
	return d
}

// joinNode writes an active node, as a join would.
func joinNode(t *testing.T, s store.Store, id, ekPin string) {
	t.Helper()
	err := s.CompleteJoin(t.Context(), store.Join{Now: t0, Node: store.Node{ID: id, State: store.StateActive, Generation: 1, EKPin: ekPin,
		Claims: store.Claims{ProductUUID: "uuid-" + id, Serials: []string{"SN-" + id}}},
		Cert: store.Cert{Serial: "s-" + id, NodeID: id, Generation: 1, Kind: "join", IssuedAt: t0, NotAfter: t0.Add(time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
}

func tpmReq(pin, serial string) Request {
	return Request{Attestor: "tpm", EKPin: pin, Claims: store.Claims{Serials: []string{serial}}}
}

func wantRefused(t *testing.T, err error, claim bool, substr string) {
	t.Helper()
	var rf *Refusal
	if !errors.As(err, &rf) {
		t.Fatalf("error %v, want a refusal saying %q", err, substr)
	}
	if rf.Claim != claim || !strings.Contains(rf.Reason, substr) {
		t.Errorf("refusal %+v, want claim %t and %q", rf, claim, substr)
	}
}

func TestAdmissionOfTPMJoins(t *testing.T) {
	s := openStore(t)
	a := &Admission{Store: s, Source: inventory.StoreSource{Store: s}, AutoProvision: true}
	declare(t, s, "alice", "declarer", worker("web-01", ekA))

	t.Run("a planned worker with a declarer's binding is admitted and auto-provisioned", func(t *testing.T) {
		out, err := a.Decide(t.Context(), tpmReq(ekA, "SN-web-01"))
		if err != nil {
			t.Fatal(err)
		}
		if out.Kind != Declared || out.Decl.Name != "web-01" || out.From != store.StatePlanned || len(out.History) != 1 || out.History[0].To != store.StateProvisioning {
			t.Errorf("outcome %+v", out)
		}
	})
	t.Run("a copied serial with another EK is refused and waits as a claim", func(t *testing.T) {
		_, err := a.Decide(t.Context(), tpmReq(ekB, "SN-web-01"))
		wantRefused(t, err, true, "whose binding names other EKs")
	})
	t.Run("a binding the owner wrote authorizes nothing", func(t *testing.T) {
		declare(t, s, "root", "owner", worker("web-02", ekB))
		_, err := a.Decide(t.Context(), tpmReq(ekB, "SN-web-02"))
		wantRefused(t, err, true, "root (role owner)")
	})
	t.Run("a planned device without a binding waits as a claim", func(t *testing.T) {
		declare(t, s, "alice", "declarer", worker("web-03"))
		_, err := a.Decide(t.Context(), tpmReq("sha256:cccc000000000000000000000000000000000000000000000000000000000003", "SN-web-03"))
		wantRefused(t, err, true, "planned without an EK binding")
	})
	t.Run("a control plane is never auto-provisioned", func(t *testing.T) {
		d := worker("cp-01", "sha256:dddd000000000000000000000000000000000000000000000000000000000004")
		d.Class = ClassControlPlane
		declare(t, s, "alice", "declarer", d)
		_, err := a.Decide(t.Context(), tpmReq(d.EKPins[0], "SN-cp-01"))
		wantRefused(t, err, true, "fleetd nodes provision cp-01")
		m := &Manager{Store: s, Source: inventory.StoreSource{Store: s}, TrustDomain: "example.test"}
		if _, err := m.Provision(t.Context(), "cp-01", "admin:op", "racked", "r1"); err != nil {
			t.Fatal(err)
		}
		out, err := a.Decide(t.Context(), tpmReq(d.EKPins[0], "SN-cp-01"))
		if err != nil || out.Kind != Declared || out.From != store.StateProvisioning || out.Node == nil || len(out.History) != 0 {
			t.Errorf("after provisioning: %+v, %v", out, err)
		}
	})
	t.Run("a substitute TPM for an active device is refused", func(t *testing.T) {
		joinNode(t, s, "web-09", ekA+"9")
		declare(t, s, "alice", "declarer", worker("web-09", ekB[:len(ekB)-1]+"9"))
		_, err := a.Decide(t.Context(), tpmReq(ekB[:len(ekB)-1]+"9", "SN-web-09"))
		wantRefused(t, err, true, "a substitute TPM")
	})
	t.Run("the proven EK re-joins its node unless it is quarantined", func(t *testing.T) {
		out, err := a.Decide(t.Context(), tpmReq(ekA+"9", ""))
		if err != nil || out.Kind != Known || out.Node.ID != "web-09" {
			t.Fatalf("re-join: %+v, %v", out, err)
		}
		m := &Manager{Store: s, Source: inventory.StoreSource{Store: s}}
		if _, err := m.Quarantine(t.Context(), "web-09", "bootpolicy", "boot check failed", ""); err != nil {
			t.Fatal(err)
		}
		_, err = a.Decide(t.Context(), tpmReq(ekA+"9", ""))
		wantRefused(t, err, false, "quarantined")
	})
}

func TestAdmissionOfTokenJoinsAndTheRequiredInventory(t *testing.T) {
	s := openStore(t)
	a := &Admission{Store: s, Source: inventory.StoreSource{Store: s}}
	declare(t, s, "alice", "declarer", worker("web-01"))
	declare(t, s, "alice", "declarer", worker("tpm-01", ekA))
	tok := &store.Token{ID: "t1", Role: "worker", CreatedBy: "op"}

	out, err := a.Decide(t.Context(), Request{Attestor: "token", Token: tok, Claims: store.Claims{Serials: []string{"SN-web-01"}}})
	if err != nil || out.Kind != Declared || out.Decl.Name != "web-01" || len(out.History) != 1 {
		t.Errorf("a token join of a planned device: %+v, %v", out, err)
	}
	_, err = a.Decide(t.Context(), Request{Attestor: "token", Token: tok, Claims: store.Claims{Serials: []string{"SN-tpm-01"}}})
	wantRefused(t, err, false, "joins only with its TPM")
	_, err = a.Decide(t.Context(), Request{Attestor: "token", Token: &store.Token{ID: "t2", Role: "gpu"}, Claims: store.Claims{Serials: []string{"SN-web-01"}}})
	wantRefused(t, err, false, `declared with role "worker"`)
	out, err = a.Decide(t.Context(), Request{Attestor: "token", Token: tok, Claims: store.Claims{Serials: []string{"SN-other"}}})
	if err != nil || out.Kind != Undeclared {
		t.Errorf("an undeclared machine with the inventory optional: %+v, %v", out, err)
	}
	a.Required = true
	_, err = a.Decide(t.Context(), Request{Attestor: "token", Token: tok, Claims: store.Claims{Serials: []string{"SN-other"}}})
	wantRefused(t, err, true, "inventory is required")
}

func TestCheckRejoin(t *testing.T) {
	for _, tt := range []struct {
		node     store.Node
		attestor string
		reclaim  bool
		want     string
	}{
		{store.Node{ID: "n", State: store.StateQuarantined}, "tpm", true, "quarantined"},
		{store.Node{ID: "n", State: store.StateRetired}, "token", true, "retired"},
		{store.Node{ID: "n", State: store.StateRevoked, EKPin: ekA}, "token", true, "held to EK"},
		{store.Node{ID: "n", State: store.StateRevoked}, "token", false, "does not allow reclaim"},
		{store.Node{ID: "n", State: store.StateRevoked}, "token", true, ""},
		{store.Node{ID: "n", State: store.StateRevoked, EKPin: ekA}, "tpm", false, ""},
		{store.Node{ID: "n", State: store.StateActive, EKPin: ekB}, "tpm", false, "a substitute TPM"},
		{store.Node{ID: "n", State: store.StateActive}, "tpm", false, "does not allow reclaim"},
		{store.Node{ID: "n", State: store.StateActive}, "tpm", true, ""},
	} {
		rf := CheckRejoin(tt.node, tt.attestor, ekA, tt.reclaim)
		switch {
		case tt.want == "" && rf != nil:
			t.Errorf("%+v by %s: refused %v", tt.node, tt.attestor, rf)
		case tt.want != "" && (rf == nil || !strings.Contains(rf.Reason, tt.want)):
			t.Errorf("%+v by %s: %v, want %q", tt.node, tt.attestor, rf, tt.want)
		}
	}
}

type hook struct {
	got []string
	err error
}

func (h *hook) Name() string { return "test" }
func (h *hook) Retired(_ context.Context, n store.Node, reason string) error {
	h.got = append(h.got, n.ID+": "+reason)
	return h.err
}

func (h *hook) Released(_ context.Context, n store.Node, reason string) error {
	h.got = append(h.got, "released "+n.ID+": "+reason)
	return h.err
}

func TestManagerActionsCheckTheStateTheyLeave(t *testing.T) {
	s := openStore(t)
	h := &hook{err: errors.New("spire down")}
	rh := &hook{err: errors.New("cluster down")}
	var revoked []string
	m := &Manager{Store: s, Source: inventory.StoreSource{Store: s}, TrustDomain: "example.test", Hooks: []RetireHook{h}, ReleaseHooks: []ReleaseHook{rh},
		Revoked: func(id, _ string, _ uint64) bool { revoked = append(revoked, id); return true }, Now: func() time.Time { return t0 }}
	joinNode(t, s, "n1", "")

	if _, err := m.Release(t.Context(), "n1", "admin:op", "oops", ""); err == nil || !strings.Contains(err.Error(), "node n1 is active: release needs state quarantined") {
		t.Errorf("release of an active node: %v", err)
	}
	if _, err := m.Quarantine(t.Context(), "n1", "admin:op", "", ""); err == nil {
		t.Errorf("a quarantine without a reason was taken")
	}
	if _, err := m.Quarantine(t.Context(), "n1", "admin:op", "suspicious", "r1"); err != nil {
		t.Fatal(err)
	}
	if res, err := m.Release(t.Context(), "n1", "admin:owner", "checked", "r2"); err != nil || res.Node.State != store.StateActive || len(res.HookErrors) != 1 {
		t.Fatalf("release: %+v, %v; want active, the release hook's error reported", res, err)
	}
	if len(rh.got) != 1 || rh.got[0] != "released n1: checked" {
		t.Errorf("release hooks told %v", rh.got)
	}
	res, err := m.Retire(t.Context(), "n1", "admin:owner", "end of life", "r3")
	if err != nil || res.Node.State != store.StateRetired || len(res.Revoked) != 1 || len(res.HookErrors) != 1 {
		t.Fatalf("retire: %+v, %v", res, err)
	}
	if len(h.got) != 1 || h.got[0] != "n1: end of life" || len(revoked) != 1 {
		t.Errorf("hooks %v, sessions ended %v", h.got, revoked)
	}
	hs, _ := s.NodeHistory(t.Context(), "n1")
	var path []string
	for _, x := range hs {
		path = append(path, x.From+">"+x.To+" by "+x.Actor)
	}
	if strings.Join(path, ", ") != "active>quarantined by admin:op, quarantined>active by admin:owner, active>retired by admin:owner" {
		t.Errorf("history: %v", path)
	}
	if _, err := m.Provision(t.Context(), "nobody", "admin:op", "x", ""); !errors.Is(err, ErrUnknown) {
		t.Errorf("provision of an unknown name: %v", err)
	}
	declare(t, s, "alice", "declarer", worker("web-01"))
	res, err = m.Provision(t.Context(), "web-01", "admin:op", "racked", "")
	if err != nil || res.Node.State != store.StateProvisioning || res.Node.Class != ClassWorker || res.Node.SPIFFEID != "spiffe://example.test/node/web-01" {
		t.Errorf("provision of a declared device: %+v, %v", res, err)
	}
}

func TestTheTableCoversEveryState(t *testing.T) {
	for _, st := range []string{store.StatePlanned, store.StateProvisioning, store.StateActive, store.StateRevoked, store.StateQuarantined, store.StateRetired} {
		found := false
		for _, r := range Table {
			found = found || r.State == st
		}
		if !found {
			t.Errorf("no row for %s", st)
		}
	}
	if May(store.StateQuarantined, Renew) || !May(store.StateQuarantined, Session) || May(store.StateRetired, TPMJoin) || !May(store.StateActive, Renew) {
		t.Errorf("the table's rows disagree with docs/lifecycle.md")
	}
}

func roleOf(s string) roles.Role { return roles.Role(s) }

// docs/lifecycle.md prints Table: each row as MarkdownRow renders it.
func TestTheDocPrintsTheTable(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/lifecycle.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range Table {
		if row := MarkdownRow(r); !strings.Contains(string(doc), row+"\n") {
			t.Errorf("docs/lifecycle.md lacks the row\n%s", row)
		}
	}
}

func TestDecideIntake(t *testing.T) {
	s := openStore(t)
	// Auto-provision is off: intake does not ask for provisioning.
	a := &Admission{Store: s, Source: inventory.StoreSource{Store: s}}
	declare(t, s, "alice", "declarer", worker("web-01", ekA))
	claims := func(serial string) store.Claims { return store.Claims{Serials: []string{serial}} }

	t.Run("a planned device whose declarer-written binding names the EK", func(t *testing.T) {
		d, why, err := a.DecideIntake(t.Context(), ekA, claims(""))
		if err != nil || d.Name != "web-01" || !strings.Contains(why, "alice") {
			t.Fatalf("DecideIntake = %+v, %q, %v", d, why, err)
		}
	})
	t.Run("another EK claiming the device", func(t *testing.T) {
		_, _, err := a.DecideIntake(t.Context(), ekB, claims("SN-web-01"))
		wantRefused(t, err, true, "whose binding names other EKs")
	})
	t.Run("an undeclared machine", func(t *testing.T) {
		_, _, err := a.DecideIntake(t.Context(), ekB, claims("SN-nowhere"))
		wantRefused(t, err, true, "only for declared machines")
	})
	t.Run("a binding an operator wrote", func(t *testing.T) {
		declare(t, s, "bob", "operator", worker("web-02", ekB))
		_, _, err := a.DecideIntake(t.Context(), ekB, claims(""))
		wantRefused(t, err, true, "not by a declarer")
	})
	t.Run("an active device", func(t *testing.T) {
		pin := ekA[:len(ekA)-1] + "7"
		declare(t, s, "alice", "declarer", worker("web-07", pin))
		joinNode(t, s, "web-07", pin)
		_, _, err := a.DecideIntake(t.Context(), pin, claims(""))
		wantRefused(t, err, true, "web-07 is active: intake is for planned or provisioning devices")
	})
	t.Run("a machine matching two declarations", func(t *testing.T) {
		pin := ekA[:len(ekA)-1] + "8"
		declare(t, s, "alice", "declarer", worker("web-08", pin))
		_, _, err := a.DecideIntake(t.Context(), pin, claims("SN-web-01"))
		wantRefused(t, err, true, "several declarations")
	})
	t.Run("an inventory that cannot answer", func(t *testing.T) {
		b := &Admission{Store: s, Source: failingSource{}}
		if _, _, err := b.DecideIntake(t.Context(), ekA, claims("")); !errors.Is(err, ErrSourceUnavailable) {
			t.Fatalf("DecideIntake with a failing source: %v, want ErrSourceUnavailable", err)
		}
	})
}

// failingSource is an inventory source that cannot answer.
type failingSource struct{}

var errSourceDown = errors.New("netbox: connection refused")

func (failingSource) Name() string { return "netbox" }
func (failingSource) Get(context.Context, string) (store.Declaration, error) {
	return store.Declaration{}, errSourceDown
}
func (failingSource) ByClaims(context.Context, string, []string) ([]store.Declaration, error) {
	return nil, errSourceDown
}
func (failingSource) ByEKPin(context.Context, string) ([]store.Declaration, error) {
	return nil, errSourceDown
}
func (failingSource) Binding(context.Context, store.Declaration) (inventory.Authority, error) {
	return inventory.Authority{}, errSourceDown
}
