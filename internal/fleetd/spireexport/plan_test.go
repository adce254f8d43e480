package spireexport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/export"
)

const td = "example.org"

func dev(id string) export.Device {
	return export.Device{NodeID: id, SPIFFEID: "spiffe://" + td + "/node/" + id, State: "active", Generation: 1,
		Agents: []export.AgentMatch{{Attestor: export.AttestorX509PoP, Selectors: []string{"x509pop:ca:fingerprint:ff", "x509pop:subject:cn:" + id}}}}
}

func doc(devices []string, retired ...string) export.Document {
	d := export.Document{Version: export.Version, TrustDomain: td, Devices: []export.Device{}, Retired: []export.Device{}}
	for _, id := range devices {
		d.Devices = append(d.Devices, dev(id))
	}
	for _, id := range retired {
		r := dev(id)
		r.State = "retired"
		d.Retired = append(d.Retired, r)
	}
	return d
}

// owned is the fleet-owned entry Desired makes for a node.
func owned(id string) Entry {
	return Desired(doc([]string{id}))[0].Entry
}

func ids(cs []Change) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Entry.ID)
	}
	return strings.Join(out, ",")
}

func TestDiff(t *testing.T) {
	changed := owned("b")
	changed.Selectors = []string{"x509pop:ca:fingerprint:00", "x509pop:subject:cn:b"}
	stray := Entry{ID: "nodetrust.x509pop.gone", SPIFFEID: "spiffe://" + td + "/node/gone", ParentID: ServerID(td), Selectors: []string{"x509pop:subject:cn:gone"}, Hint: Hint}
	for _, c := range []struct {
		name                            string
		doc                             export.Document
		fleet                           []Entry
		create, update, delete, removed string
	}{
		{"a new fleet", doc([]string{"a", "b"}), nil, "nodetrust.x509pop.a,nodetrust.x509pop.b", "", "", ""},
		{"nothing to do", doc([]string{"a"}), []Entry{owned("a")}, "", "", "", ""},
		{"a CA that changed updates", doc([]string{"a", "b"}), []Entry{owned("a"), changed}, "", "nodetrust.x509pop.b", "", ""},
		{"a node that left is withdrawn", doc([]string{"a"}), []Entry{owned("a"), owned("b")}, "", "", "nodetrust.x509pop.b", "b"},
		{"a retired node is withdrawn", doc([]string{"a"}, "b"), []Entry{owned("a"), owned("b")}, "", "", "nodetrust.x509pop.b", "b"},
		{"two at once", doc([]string{"a"}), []Entry{owned("a"), owned("b"), stray}, "", "", "nodetrust.x509pop.b,nodetrust.x509pop.gone", "b,gone"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Diff(c.doc, c.fleet)
			if got := ids(p.Create); got != c.create {
				t.Errorf("create %q, want %q", got, c.create)
			}
			if got := ids(p.Update); got != c.update {
				t.Errorf("update %q, want %q", got, c.update)
			}
			if got := ids(p.Delete); got != c.delete {
				t.Errorf("delete %q, want %q", got, c.delete)
			}
			if got := strings.Join(p.Withdrawn, ","); got != c.removed {
				t.Errorf("withdrawn %q, want %q", got, c.removed)
			}
		})
	}
}

func TestDesiredEntriesAreFleetOwnedNodeAliases(t *testing.T) {
	e := owned("a")
	if e.Hint != Hint || e.ParentID != "spiffe://example.org/spire/server" || e.SPIFFEID != "spiffe://example.org/node/a" || e.ID != "nodetrust.x509pop.a" {
		t.Fatalf("entry %+v", e)
	}
}

func TestBans(t *testing.T) {
	agent := func(id string, banned bool, carriers ...Entry) Agent {
		return Agent{ID: id, Attested: true, Banned: banned, Carriers: carriers}
	}
	other := Entry{ID: "e-other", SPIFFEID: "spiffe://" + td + "/workload/db"}
	own := Entry{ID: "e-own-alias", SPIFFEID: "spiffe://" + td + "/node/b"}
	deletedC := owned("c")
	deletedC.SPIFFEID = "spiffe://" + td + "/node/c"
	for _, c := range []struct {
		name               string
		doc                export.Document
		fleet              []Entry
		found              map[string][]Agent
		ban, kept, pending string
		nodes              int
	}{
		{"a withdrawn node's agent is banned", doc([]string{"a"}), []Entry{owned("a"), owned("b")},
			map[string][]Agent{"b": {agent("agent-b", false)}}, "agent-b", "", "", 1},
		{"unless another registration carries it", doc([]string{"a"}), []Entry{owned("a"), owned("b")},
			map[string][]Agent{"b": {agent("agent-b", false, other)}}, "", "agent-b", "", 1},
		{"the node's own alias does not carry it", doc([]string{"a"}), []Entry{owned("a"), owned("b")},
			map[string][]Agent{"b": {agent("agent-b", false, own)}}, "agent-b", "", "", 1},
		{"an entry the plan deletes does not carry it", doc([]string{"a"}), []Entry{owned("a"), owned("b"), deletedC},
			map[string][]Agent{"b": {agent("agent-b", false, deletedC)}}, "agent-b", "", "", 2},
		{"a retired node's agent is banned on sight, carried or not", doc([]string{"a"}, "b"), []Entry{owned("a")},
			map[string][]Agent{"b": {agent("agent-b", false, other)}}, "agent-b", "", "", 1},
		{"an agent already banned needs nothing", doc([]string{"a"}, "b"), []Entry{owned("a")},
			map[string][]Agent{"b": {agent("agent-b", true)}}, "", "", "", 0},
		{"a retired node with no attested agent is pending", doc([]string{"a"}, "b"), []Entry{owned("a")},
			map[string][]Agent{"b": {{ID: "spiffe://example.org/spire/agent/join_token/t", Attested: false}}}, "", "", "b", 0},
		{"a retired node with no agent at all is pending", doc([]string{"a"}, "b"), []Entry{owned("a")},
			nil, "", "", "b", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Bans(c.doc, Diff(c.doc, c.fleet), c.found)
			var ban, kept, pending []string
			for _, b := range p.Ban {
				ban = append(ban, b.AgentID)
			}
			for _, k := range p.Kept {
				kept = append(kept, k.AgentID)
			}
			for _, x := range p.Pending {
				if !slices.Contains(pending, x.NodeID) {
					pending = append(pending, x.NodeID)
				}
			}
			if strings.Join(ban, ",") != c.ban || strings.Join(kept, ",") != c.kept || strings.Join(pending, ",") != c.pending {
				t.Fatalf("ban %v kept %v pending %v; want %q %q %q", ban, kept, pending, c.ban, c.kept, c.pending)
			}
			if len(p.Nodes()) != c.nodes {
				t.Fatalf("nodes %v, want %d", p.Nodes(), c.nodes)
			}
		})
	}
}

// recorder keeps the runs an Applier records.
type recorder struct{ runs []export.Run }

func (r *recorder) Allowed(context.Context, string) (bool, error) { return false, nil }
func (r *recorder) Record(_ context.Context, run export.Run) error {
	r.runs = append(r.runs, run)
	return nil
}

// The safeguards that need no SPIRE server: a malformed or unverifiable
// export and an empty device list hold before the server is asked
// anything (the Applier has no SPIRE here: any call would panic).
func TestRunHoldsBeforeAskingSPIRE(t *testing.T) {
	empty, emptyDigest := envelope(t, doc(nil, "old"))
	good, _ := envelope(t, doc([]string{"a"}))
	// A generation is a field the document's own checks accept whatever
	// its value: only the digest tells this document was changed.
	tampered := []byte(strings.Replace(string(good), `"generation":1`, `"generation":2`, 1))
	if bytes.Equal(tampered, good) {
		t.Fatal("the test's tampering changed nothing")
	}
	for _, c := range []struct {
		name   string
		data   []byte
		reason string
		digest string
		held   string // in the recorded Held text
	}{
		{"malformed", []byte(`{"version":1,"digest":`), export.HeldMalformed, "", ""},
		{"unverifiable", tampered, export.HeldMalformed, "", "does not match"},
		{"empty device list", empty, export.HeldEmpty, emptyDigest, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{}
			a := &Applier{Safeguards: rec, TrustDomain: td}
			res, err := a.Run(t.Context(), c.data, false)
			if !errors.Is(err, ErrHeld) {
				t.Fatalf("Run: %v, want ErrHeld", err)
			}
			if len(rec.runs) != 1 || rec.runs[0].Outcome != export.OutcomeHeld || rec.runs[0].HeldReason != c.reason || rec.runs[0].Digest != c.digest {
				t.Fatalf("recorded %+v, want one held run (%s, digest %q)", rec.runs, c.reason, c.digest)
			}
			if !strings.Contains(rec.runs[0].Held, c.held) {
				t.Errorf("held %q, want it to say %q", rec.runs[0].Held, c.held)
			}
			if !res.Plan.Empty() {
				t.Fatalf("plan %+v is not empty", res.Plan)
			}
		})
	}
}

func envelope(t *testing.T, d export.Document) ([]byte, string) {
	t.Helper()
	body, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	digest := export.Digest(body)
	env, err := json.Marshal(export.Envelope{Version: export.Version, Digest: digest, Document: body})
	if err != nil {
		t.Fatal(err)
	}
	return env, digest
}
