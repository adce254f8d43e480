package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

func normAdmin(c store.AdminCred) store.AdminCred {
	c.CreatedAt, c.NotAfter, c.RevokedAt = normTime(c.CreatedAt), normTime(c.NotAfter), normTime(c.RevokedAt)
	return c
}

func normDecl(d store.Declaration) store.Declaration {
	d.UpdatedAt = normTime(d.UpdatedAt)
	d.MACs, d.EKPins = normList(d.MACs), normList(d.EKPins)
	return d
}

func normChange(c store.FieldChange) store.FieldChange {
	c.Time = normTime(c.Time)
	return c
}

func normHistory(h store.StateChange) store.StateChange {
	h.Time = normTime(h.Time)
	return h
}

func normClaim(c store.Claim) store.Claim {
	c.FirstSeen, c.LastSeen = normTime(c.FirstSeen), normTime(c.LastSeen)
	c.Serials, c.MACs = normList(c.Serials), normList(c.MACs)
	return c
}

func newAdmin(serial, name, role string, created time.Time) store.AdminCred {
	return store.AdminCred{Serial: serial, Name: name, Role: role, CreatedBy: "owner", CreatedAt: created, NotAfter: created.Add(365 * 24 * time.Hour)}
}

func newDecl(name string) store.Declaration {
	return store.Declaration{
		Name: name, Serial: "SN-" + name, ProductUUID: "uuid-" + name, MACs: []string{"02:00:00:00:00:0a"},
		Class: "worker", Site: "rack1", Role: "worker", SwitchChassis: "sw1", SwitchPort: "ge-0/0/1",
		InstallDisk: "/dev/sda", EKPins: []string{"sha256:ek-" + name}, EKSource: "receiving-scan", EKReference: "scan 1",
		UpdatedAt: at(0),
	}
}

func mustApply(t *testing.T, s store.Store, w store.InventoryWrite) {
	t.Helper()
	if err := s.ApplyInventory(t.Context(), w); err != nil {
		t.Fatalf("ApplyInventory: %v", err)
	}
}

var adminCases = []testCase{
	{"admin credentials are created, found by serial and listed by name", func(t *testing.T, s store.Store) {
		b := newAdmin("02", "bob", "operator", at(time.Minute))
		a := newAdmin("01", "alice", "declarer", at(2*time.Minute))
		for _, c := range []store.AdminCred{b, a} {
			if err := s.CreateAdmin(t.Context(), c, newAudit("admin.create", c.Name, c.CreatedAt)); err != nil {
				t.Fatalf("CreateAdmin(%s): %v", c.Name, err)
			}
		}
		got, err := s.GetAdmin(t.Context(), "01")
		if err != nil {
			t.Fatalf("GetAdmin: %v", err)
		}
		wantEqual(t, "admin 01", normAdmin, got, a)
		_, err = s.GetAdmin(t.Context(), "99")
		wantErr(t, "GetAdmin(unknown)", err, store.ErrNotFound)
		all, err := s.ListAdmins(t.Context())
		if err != nil || len(all) != 2 || all[0].Name != "alice" || all[1].Name != "bob" {
			t.Fatalf("ListAdmins = %+v, %v; want alice then bob", all, err)
		}
		wantAudit(t, "after two creations", s, newAudit("admin.create", "alice", a.CreatedAt), newAudit("admin.create", "bob", b.CreatedAt))
	}},
	{"an admin serial or an unrevoked name is not created twice", func(t *testing.T, s store.Store) {
		if err := s.CreateAdmin(t.Context(), newAdmin("01", "alice", "owner", at(0)), nil); err != nil {
			t.Fatal(err)
		}
		err := s.CreateAdmin(t.Context(), newAdmin("01", "carol", "owner", at(0)), newAudit("admin.create", "carol", at(0)))
		wantErr(t, "same serial", err, store.ErrConflict)
		err = s.CreateAdmin(t.Context(), newAdmin("02", "alice", "auditor", at(0)), nil)
		wantErr(t, "same unrevoked name", err, store.ErrConflict)
		wantAudit(t, "after refused creations", s)
	}},
	{"revoking an admin revokes every unrevoked credential of the name, and the name may be used again", func(t *testing.T, s store.Store) {
		if err := s.CreateAdmin(t.Context(), newAdmin("01", "alice", "declarer", at(0)), nil); err != nil {
			t.Fatal(err)
		}
		ev := newAudit("admin.revoke", "alice", at(time.Hour))
		revoked, err := s.RevokeAdmin(t.Context(), "alice", "owner", at(time.Hour), ev)
		if err != nil || len(revoked) != 1 || revoked[0].Serial != "01" {
			t.Fatalf("RevokeAdmin = %+v, %v", revoked, err)
		}
		got, err := s.GetAdmin(t.Context(), "01")
		if err != nil || !got.RevokedAt.Equal(at(time.Hour)) || got.RevokedBy != "owner" {
			t.Errorf("after revocation: %+v, %v", got, err)
		}
		_, err = s.RevokeAdmin(t.Context(), "alice", "owner", at(2*time.Hour), newAudit("admin.revoke", "alice", at(2*time.Hour)))
		wantErr(t, "revoking again", err, store.ErrNotFound)
		if err := s.CreateAdmin(t.Context(), newAdmin("02", "alice", "declarer", at(3*time.Hour)), nil); err != nil {
			t.Errorf("a revoked name could not be used again: %v", err)
		}
		wantAudit(t, "after one revocation", s, ev)
	}},
}

var inventoryCases = []testCase{
	{"declarations are written with their changelog and read back", func(t *testing.T, s store.Store) {
		a, b := newDecl("web-b"), newDecl("web-a")
		b.MACs, b.EKPins, b.EKSource, b.EKReference, b.InstallDisk = nil, nil, "", "", ""
		ch := store.FieldChange{Time: at(0), Device: "web-a", Field: "serial", Old: "", New: b.Serial,
			Actor: "alice", ActorRole: "declarer", RequestID: "req-1", Source: "inventory"}
		ev := newAudit("inventory.apply", "inventory", at(0))
		mustApply(t, s, store.InventoryWrite{Writes: []store.DeclarationWrite{{Declaration: a}, {Declaration: b}}, Changes: []store.FieldChange{ch}, Audit: ev})
		a.Version, b.Version = 1, 1
		got, err := s.GetDeclaration(t.Context(), "web-b")
		if err != nil {
			t.Fatal(err)
		}
		wantEqual(t, "web-b", normDecl, got, a)
		all, err := s.ListDeclarations(t.Context())
		if err != nil || len(all) != 2 {
			t.Fatalf("ListDeclarations = %v, %v", all, err)
		}
		wantEqual(t, "first listed", normDecl, all[0], b)
		_, err = s.GetDeclaration(t.Context(), "web-c")
		wantErr(t, "GetDeclaration(unknown)", err, store.ErrNotFound)
		cs, err := s.ListChanges(t.Context(), "web-a", 10)
		if err != nil || len(cs) != 1 {
			t.Fatalf("ListChanges = %v, %v", cs, err)
		}
		wantEqual(t, "change", normChange, cs[0], ch)
		if cs, _ := s.ListChanges(t.Context(), "web-b", 10); len(cs) != 0 {
			t.Errorf("web-b has changes %v", cs)
		}
		wantAudit(t, "after an apply", s, ev)
	}},
	{"a declaration is replaced only at the version it was read", func(t *testing.T, s store.Store) {
		d := newDecl("web-1")
		mustApply(t, s, store.InventoryWrite{Writes: []store.DeclarationWrite{{Declaration: d}}})
		err := s.ApplyInventory(t.Context(), store.InventoryWrite{Writes: []store.DeclarationWrite{{Declaration: d}}})
		wantErr(t, "inserting an existing name", err, store.ErrConflict)
		d.Site, d.InstallDisk = "rack2", "/dev/disk/by-id/nvme-eui.0002"
		mustApply(t, s, store.InventoryWrite{Writes: []store.DeclarationWrite{{Declaration: d, PrevVersion: 1}}})
		other := newDecl("web-2")
		ch := store.FieldChange{Time: at(time.Minute), Device: "web-2", Field: "serial", New: "x", Actor: "alice"}
		err = s.ApplyInventory(t.Context(), store.InventoryWrite{
			Writes:  []store.DeclarationWrite{{Declaration: other}, {Declaration: d, PrevVersion: 1}},
			Changes: []store.FieldChange{ch},
			Audit:   newAudit("inventory.apply", "inventory", at(time.Minute)),
		})
		wantErr(t, "a stale version", err, store.ErrConflict)
		if _, err := s.GetDeclaration(t.Context(), "web-2"); err == nil {
			t.Errorf("a refused apply wrote another declaration")
		}
		if cs, _ := s.ListChanges(t.Context(), "", 10); len(cs) != 0 {
			t.Errorf("a refused apply wrote changes %v", cs)
		}
		wantAudit(t, "after a refused apply", s)
		got, _ := s.GetDeclaration(t.Context(), "web-1")
		if got.Version != 2 || got.Site != "rack2" || got.InstallDisk != "/dev/disk/by-id/nvme-eui.0002" {
			t.Errorf("after the update: version %d site %s install disk %s", got.Version, got.Site, got.InstallDisk)
		}
	}},
	{"declarations are found by product uuid, serial and EK pin", func(t *testing.T, s store.Store) {
		a, b := newDecl("a"), newDecl("b")
		b.EKPins = []string{"sha256:shared", "sha256:ek-b"}
		a.EKPins = []string{"sha256:shared"}
		mustApply(t, s, store.InventoryWrite{Writes: []store.DeclarationWrite{{Declaration: a}, {Declaration: b}}})
		for _, c := range []struct {
			name    string
			uuid    string
			serials []string
			want    []string
		}{
			{"by uuid", "uuid-b", nil, []string{"b"}},
			{"by serial", "", []string{"x", "SN-a"}, []string{"a"}},
			{"by both", "uuid-a", []string{"SN-b"}, []string{"a", "b"}},
			{"nothing", "", []string{""}, nil},
			{"unknown", "uuid-z", []string{"SN-z"}, nil},
		} {
			ds, err := s.DeclarationsByClaims(t.Context(), c.uuid, c.serials)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range ds {
				got = append(got, d.Name)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("%s: %v, want %v", c.name, got, c.want)
			}
		}
		ds, err := s.DeclarationsByEKPin(t.Context(), "sha256:shared")
		if err != nil || len(ds) != 2 || ds[0].Name != "a" {
			t.Errorf("by shared pin: %v, %v", ds, err)
		}
		b.EKPins = []string{"sha256:new"}
		mustApply(t, s, store.InventoryWrite{Writes: []store.DeclarationWrite{{Declaration: b, PrevVersion: 1}}})
		if ds, _ := s.DeclarationsByEKPin(t.Context(), "sha256:ek-b"); len(ds) != 0 {
			t.Errorf("a pin removed from the binding still finds %v", ds)
		}
		if ds, _ := s.DeclarationsByEKPin(t.Context(), "sha256:new"); len(ds) != 1 {
			t.Errorf("the new pin finds %v", ds)
		}
	}},
	{"the changelog lists newest first, by device, up to the limit", func(t *testing.T, s store.Store) {
		var all []store.FieldChange
		for i, dev := range []string{"a", "b", "a", "a"} {
			all = append(all, store.FieldChange{Time: at(time.Duration(i) * time.Minute), Device: dev, Field: "site", New: fmt.Sprint(i), Actor: "alice"})
		}
		mustApply(t, s, store.InventoryWrite{Changes: all})
		cs, err := s.ListChanges(t.Context(), "a", 2)
		if err != nil || len(cs) != 2 || cs[0].New != "3" || cs[1].New != "2" {
			t.Errorf("ListChanges(a, 2) = %v, %v", cs, err)
		}
		cs, _ = s.ListChanges(t.Context(), "", 10)
		if len(cs) != 4 || cs[3].New != "0" {
			t.Errorf("ListChanges(all) = %v", cs)
		}
		if _, err := s.ListChanges(t.Context(), "a", 0); err == nil {
			t.Errorf("a limit of 0 was accepted")
		}
	}},
	{"a declaration sets its node's class, and its role and site while planned", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		d := newDecl("node-1")
		d.Class, d.Role, d.Site = "control-plane", "cp", "rack9"
		mustApply(t, s, store.InventoryWrite{Writes: []store.DeclarationWrite{{Declaration: d}}})
		n := mustGetNode(t, s, "node-1")
		if n.Class != "control-plane" || n.Role != "worker" || n.Site != "site-a" {
			t.Errorf("an active node after a declaration: class %q role %q site %q", n.Class, n.Role, n.Site)
		}
	}},
}

var lifecycleCases = []testCase{
	{"a transition changes the state, keeps a history and audits", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		ev := newAudit("node.quarantine", "node-1", at(time.Minute))
		n, serials, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "node-1", From: []string{store.StateActive}, To: store.StateQuarantined,
			Time: at(time.Minute), Actor: "admin:op", Reason: "boot check failed", RequestID: "r1", Audit: ev})
		if err != nil || n.State != store.StateQuarantined || len(serials) != 0 || n.Generation != 1 {
			t.Fatalf("quarantine = %+v, %v, %v", n, serials, err)
		}
		if c := mustGetCert(t, s, "s1"); !c.RevokedAt.IsZero() {
			t.Errorf("a quarantine revoked the certificate")
		}
		_, _, err = s.TransitionNode(t.Context(), store.Transition{NodeID: "node-1", From: []string{store.StateActive}, To: store.StateQuarantined, Time: at(2 * time.Minute), Actor: "x", Audit: newAudit("x", "node-1", at(2*time.Minute))})
		wantErr(t, "from a state the node is not in", err, store.ErrConflict)
		_, _, err = s.TransitionNode(t.Context(), store.Transition{NodeID: "node-9", From: []string{store.StateActive}, To: store.StateQuarantined, Time: at(0)})
		wantErr(t, "an unknown node", err, store.ErrNotFound)
		hs, err := s.NodeHistory(t.Context(), "node-1")
		if err != nil || len(hs) != 1 {
			t.Fatalf("NodeHistory = %v, %v", hs, err)
		}
		wantEqual(t, "history", normHistory, hs[0], store.StateChange{Time: at(time.Minute), NodeID: "node-1", From: store.StateActive, To: store.StateQuarantined, Actor: "admin:op", Reason: "boot check failed", RequestID: "r1"})
		wantAudit(t, "after one transition", s, ev)
	}},
	{"a retirement revokes the certificates and raises the generation", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		n, serials, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "node-1", From: []string{store.StateActive}, To: store.StateRetired,
			Revoke: true, Time: at(time.Hour), Actor: "admin:owner", Reason: "end of life"})
		if err != nil || n.State != store.StateRetired || n.Generation != 2 || len(serials) != 1 {
			t.Fatalf("retire = %+v, %v, %v", n, serials, err)
		}
		if c := mustGetCert(t, s, "s1"); c.RevokedReason != "end of life" {
			t.Errorf("certificate after retirement: %+v", c)
		}
		if hs, _ := s.NodeHistory(t.Context(), "node-1"); len(hs) != 1 || hs[0].To != store.StateRetired {
			t.Errorf("history after retirement: %+v", hs)
		}
	}},
	{"a transition may create the node of a planned device", func(t *testing.T, s store.Store) {
		n := newNode("dev-1", 1, "", at(0))
		n.CertNotAfter, n.JoinedAt, n.LastSeen = time.Time{}, time.Time{}, time.Time{}
		got, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "dev-1", From: []string{store.StatePlanned}, To: store.StateProvisioning,
			Create: &n, Time: at(0), Actor: "admin:op", Reason: "rack installed"})
		if err != nil || got.State != store.StateProvisioning {
			t.Fatalf("provision = %+v, %v", got, err)
		}
		hs, _ := s.NodeHistory(t.Context(), "dev-1")
		if len(hs) != 1 || hs[0].From != store.StatePlanned || hs[0].To != store.StateProvisioning {
			t.Errorf("history: %+v", hs)
		}
		_, _, err = s.TransitionNode(t.Context(), store.Transition{NodeID: "dev-1", From: []string{store.StatePlanned}, To: store.StateProvisioning, Create: &n, Time: at(0)})
		wantErr(t, "provisioning twice", err, store.ErrConflict)
	}},
	{"only an active node renews", func(t *testing.T, s store.Store) {
		for i, state := range []string{store.StateQuarantined, store.StateRetired} {
			id := fmt.Sprintf("node-%d", i)
			mustJoin(t, s, newJoin("", id, "s-"+id, at(0)))
			if _, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: id, From: []string{store.StateActive}, To: state, Time: at(time.Minute), Actor: "x"}); err != nil {
				t.Fatal(err)
			}
			err := s.RecordRenewal(t.Context(), newCert("r-"+id, id, 1, "renew", at(2*time.Minute)), nil)
			wantErr(t, "renewal of a "+state+" node", err, store.ErrConflict)
		}
		mustJoin(t, s, newJoin("", "node-p", "s-p", at(0)))
		if _, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "node-p", From: []string{store.StateActive}, To: store.StateProvisioning, Time: at(time.Minute), Actor: "x"}); err != nil {
			t.Fatal(err)
		}
		err := s.RecordRenewal(t.Context(), newCert("r-p", "node-p", 1, "renew", at(2*time.Minute)), nil)
		wantErr(t, "renewal of a provisioning node", err, store.ErrConflict)
	}},
	{"a revocation keeps a quarantine and a retirement, and records the change from active", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "q", "s-q", at(0)))
		mustJoin(t, s, newJoin("", "a", "s-a", at(0)))
		if _, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "q", From: []string{store.StateActive}, To: store.StateQuarantined, Time: at(time.Minute), Actor: "x"}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"q", "a"} {
			if _, _, err := s.RevokeNode(t.Context(), id, "stolen", at(time.Hour), newAudit("node.revoke", id, at(time.Hour))); err != nil {
				t.Fatal(err)
			}
		}
		if n := mustGetNode(t, s, "q"); n.State != store.StateQuarantined || n.Generation != 2 {
			t.Errorf("a revoked quarantined node: %s at %d", n.State, n.Generation)
		}
		if n := mustGetNode(t, s, "a"); n.State != store.StateRevoked {
			t.Errorf("a revoked active node: %s", n.State)
		}
		hs, _ := s.NodeHistory(t.Context(), "a")
		if len(hs) != 1 || hs[0].From != store.StateActive || hs[0].To != store.StateRevoked || hs[0].Actor != "admin@example.org" {
			t.Errorf("history of the revoked node: %+v", hs)
		}
		if hs, _ := s.NodeHistory(t.Context(), "q"); len(hs) != 1 {
			t.Errorf("a revocation that kept the state wrote history: %+v", hs)
		}
	}},
	{"a join that expects a state is refused when the node moved, and writes history and settles a claim", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		if err := s.RecordClaim(t.Context(), store.Claim{Key: "ek:1", Reason: "unknown", LastSeen: at(0)}, 10); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "node-1", From: []string{store.StateActive}, To: store.StateQuarantined, Time: at(time.Minute), Actor: "x"}); err != nil {
			t.Fatal(err)
		}
		j := store.Join{Now: at(time.Hour), Reclaim: true, Node: newNode("node-1", 2, "s2", at(time.Hour)), Cert: newCert("s2", "node-1", 2, "join", at(time.Hour)),
			ExpectState: store.StateActive, ExpectGeneration: 1, ClaimKey: "ek:1",
			History: []store.StateChange{{Time: at(time.Hour), NodeID: "node-1", From: store.StateActive, To: store.StateActive, Actor: "ek"}}}
		wantErr(t, "join of a node that was quarantined meanwhile", s.CompleteJoin(t.Context(), j), store.ErrConflict)
		j.ExpectState = store.StateQuarantined
		j.ExpectGeneration = 2
		wantErr(t, "join expecting another generation", s.CompleteJoin(t.Context(), j), store.ErrConflict)
		j.ExpectGeneration = 1
		mustJoin(t, s, j)
		if hs, _ := s.NodeHistory(t.Context(), "node-1"); len(hs) != 2 || hs[1].Actor != "ek" {
			t.Errorf("history after the join: %+v", hs)
		}
		if cs, _ := s.ListClaims(t.Context(), 10); len(cs) != 0 {
			t.Errorf("the join left its claim: %+v", cs)
		}
	}},
}

var ekCases = []testCase{
	{"the node of an EK pin is one that is not retired when there is one", func(t *testing.T, s store.Store) {
		for _, id := range []string{"a-old", "b-new"} {
			j := newJoin("", id, "s-"+id, at(0))
			j.Node.EKPin = "sha256:same"
			mustJoin(t, s, j)
		}
		if n, err := s.NodeByEKPin(t.Context(), "sha256:same"); err != nil || n.ID != "a-old" {
			t.Errorf("two active nodes: %v, %v; want the lowest id", n.ID, err)
		}
		if _, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "a-old", From: []string{store.StateActive}, To: store.StateRetired, Revoke: true, Time: at(time.Hour), Actor: "x", Reason: "r"}); err != nil {
			t.Fatal(err)
		}
		if n, err := s.NodeByEKPin(t.Context(), "sha256:same"); err != nil || n.ID != "b-new" {
			t.Errorf("after a retirement: %v, %v; want b-new", n.ID, err)
		}
	}},
}

var claimCases = []testCase{
	{"claims count repeats, keep their first sighting and list newest first", func(t *testing.T, s store.Store) {
		c := store.Claim{Key: "uuid:1", Attestor: "token", ProductUUID: "1", Serials: []string{"SN1"}, MACs: []string{"02:00:00:00:00:01"},
			Hostname: "h1", Peer: "127.0.0.1:1", Reason: "not declared", LastSeen: at(0)}
		if err := s.RecordClaim(t.Context(), c, 10); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordClaim(t.Context(), store.Claim{Key: "uuid:2", Reason: "r", LastSeen: at(time.Minute)}, 10); err != nil {
			t.Fatal(err)
		}
		c2 := c
		c2.Reason, c2.LastSeen = "planned without a binding", at(time.Hour)
		if err := s.RecordClaim(t.Context(), c2, 10); err != nil {
			t.Fatal(err)
		}
		cs, err := s.ListClaims(t.Context(), 10)
		if err != nil || len(cs) != 2 {
			t.Fatalf("ListClaims = %v, %v", cs, err)
		}
		want := c2
		want.FirstSeen, want.Count = at(0), 2
		wantEqual(t, "the repeated claim", normClaim, cs[0], want)
		if _, err := s.ListClaims(t.Context(), 0); err == nil {
			t.Errorf("a limit of 0 was accepted")
		}
		if err := s.RecordClaim(t.Context(), c, 0); err == nil {
			t.Errorf("a max of 0 was accepted")
		}
	}},
	{"claims beyond the bound push out the one seen longest ago", func(t *testing.T, s store.Store) {
		for i := range 5 {
			if err := s.RecordClaim(t.Context(), store.Claim{Key: fmt.Sprint("k", i), LastSeen: at(time.Duration(i) * time.Minute)}, 3); err != nil {
				t.Fatal(err)
			}
		}
		cs, _ := s.ListClaims(t.Context(), 10)
		if len(cs) != 3 || cs[0].Key != "k4" || cs[2].Key != "k2" {
			t.Errorf("claims after 5 with a bound of 3: %+v", cs)
		}
	}},
}
