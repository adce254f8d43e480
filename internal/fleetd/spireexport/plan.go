package spireexport

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nodetrust/nodetrust/internal/fleetd/export"
)

// Hint marks the registration entries nodetrust owns.
const Hint = "nodetrust"

// Entry is a SPIRE registration entry as the planner sees it. Selectors
// are "type:value", sorted.
type Entry struct {
	ID        string   `json:"id,omitempty"`
	SPIFFEID  string   `json:"spiffe_id"`
	ParentID  string   `json:"parent_id"`
	Selectors []string `json:"selectors"`
	Hint      string   `json:"hint,omitempty"`
}

// Change is an entry to create, update or delete, and the node it is for.
type Change struct {
	NodeID string `json:"node_id"`
	Entry  Entry  `json:"entry"`
}

// Ban is an agent to ban, and why.
type Ban struct {
	NodeID  string `json:"node_id"`
	AgentID string `json:"agent_id"`
	Why     string `json:"why"`
}

// Kept is a withdrawn node's agent left alone because another
// registration still carries it.
type Kept struct {
	NodeID    string `json:"node_id"`
	AgentID   string `json:"agent_id"`
	CarriedBy string `json:"carried_by"`
}

// Pending is a retired node whose agent cannot be banned yet: none
// attested (AgentID empty), or a join-token agent named by an alias whose
// token was never used. It is banned by the run that finds it attested.
type Pending struct {
	NodeID  string `json:"node_id"`
	AgentID string `json:"agent_id,omitempty"`
}

// Plan is what one run would do.
type Plan struct {
	Digest string   `json:"digest"`
	Create []Change `json:"create"`
	Update []Change `json:"update"`
	Delete []Change `json:"delete"`
	Ban    []Ban    `json:"ban"`
	Kept   []Kept   `json:"kept,omitempty"`
	// Pending are retired nodes whose agents are not attested yet.
	Pending []Pending `json:"pending,omitempty"`
	// Withdrawn are the nodes whose last fleet-owned entries go.
	Withdrawn []string `json:"withdrawn"`
}

// Nodes are the distinct nodes the plan withdraws or bans: what the
// threshold counts.
func (p Plan) Nodes() []string {
	set := map[string]bool{}
	for _, n := range p.Withdrawn {
		set[n] = true
	}
	for _, b := range p.Ban {
		set[b.NodeID] = true
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Empty says the plan changes nothing.
func (p Plan) Empty() bool {
	return len(p.Create) == 0 && len(p.Update) == 0 && len(p.Delete) == 0 && len(p.Ban) == 0
}

// Summary is one line saying what the plan does.
func (p Plan) Summary() string {
	s := fmt.Sprintf("%d create, %d update, %d delete, %d ban", len(p.Create), len(p.Update), len(p.Delete), len(p.Ban))
	if n := p.Nodes(); len(n) > 0 {
		s += "; withdraws or bans " + capList(n, 10)
	}
	if len(p.Pending) > 0 {
		ids := make([]string, len(p.Pending))
		for i, x := range p.Pending {
			ids[i] = x.NodeID
		}
		s += "; ban pending (agent not attested) for " + capList(ids, 10)
	}
	return s
}

// capList joins at most n names and says how many more there are.
func capList(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// ServerID is the SPIFFE ID of a trust domain's SPIRE server: the parent
// of node alias entries.
func ServerID(trustDomain string) string { return "spiffe://" + trustDomain + "/spire/server" }

// AgentPrefix starts every SPIRE agent's SPIFFE ID in a trust domain.
func AgentPrefix(trustDomain string) string { return "spiffe://" + trustDomain + "/spire/agent/" }

// EntryID is the id of the fleet-owned entry of a node for an attestor.
func EntryID(nodeID, attestor string) string { return "nodetrust." + attestor + "." + nodeID }

// Desired are the fleet-owned entries the export's eligible devices need,
// ordered by id.
func Desired(doc export.Document) []Change {
	var out []Change
	parent := ServerID(doc.TrustDomain)
	for _, d := range doc.Devices {
		for _, a := range d.Agents {
			sel := slices.Clone(a.Selectors)
			slices.Sort(sel)
			out = append(out, Change{NodeID: d.NodeID, Entry: Entry{ID: EntryID(d.NodeID, a.Attestor), SPIFFEID: d.SPIFFEID, ParentID: parent, Selectors: sel, Hint: Hint}})
		}
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Entry.ID, b.Entry.ID) })
	return out
}

// NodeOf is the node id an entry's SPIFFE ID names in the trust domain
// ("" when it names no node).
func NodeOf(trustDomain, spiffeID string) string {
	id, ok := strings.CutPrefix(spiffeID, "spiffe://"+trustDomain+"/node/")
	if !ok || strings.Contains(id, "/") {
		return ""
	}
	return id
}

// Diff plans the entry changes: desired entries missing from the
// fleet-owned ones are created, those that differ updated, and
// fleet-owned entries the export no longer wants deleted. A node none of
// whose desired entries remain is withdrawn.
func Diff(doc export.Document, fleetOwned []Entry) Plan {
	p := Plan{Create: []Change{}, Update: []Change{}, Delete: []Change{}, Ban: []Ban{}, Withdrawn: []string{}}
	have := make(map[string]Entry, len(fleetOwned))
	for _, e := range fleetOwned {
		have[e.ID] = e
	}
	want := map[string]bool{}
	for _, c := range Desired(doc) {
		want[c.Entry.ID] = true
		cur, ok := have[c.Entry.ID]
		switch {
		case !ok:
			p.Create = append(p.Create, c)
		case !sameEntry(cur, c.Entry):
			p.Update = append(p.Update, c)
		}
	}
	eligible := map[string]bool{}
	for _, d := range doc.Devices {
		eligible[d.NodeID] = true
	}
	withdrawn := map[string]bool{}
	for _, e := range fleetOwned {
		if want[e.ID] {
			continue
		}
		node := NodeOf(doc.TrustDomain, e.SPIFFEID)
		p.Delete = append(p.Delete, Change{NodeID: node, Entry: e})
		if node != "" && !eligible[node] {
			withdrawn[node] = true
		}
	}
	slices.SortFunc(p.Delete, func(a, b Change) int { return strings.Compare(a.Entry.ID, b.Entry.ID) })
	for n := range withdrawn {
		p.Withdrawn = append(p.Withdrawn, n)
	}
	slices.Sort(p.Withdrawn)
	return p
}

func sameEntry(a, b Entry) bool {
	sa, sb := slices.Clone(a.Selectors), slices.Clone(b.Selectors)
	slices.Sort(sa)
	slices.Sort(sb)
	return a.SPIFFEID == b.SPIFFEID && a.ParentID == b.ParentID && slices.Equal(sa, sb) && a.Hint == b.Hint
}

// Agent is a SPIRE agent found for a node: by its selectors, or as the
// parent of a join-token alias of the node's SPIFFE ID.
type Agent struct {
	ID     string
	Banned bool
	// Attested is false for the agent of a join-token alias whose token
	// was never used: SPIRE cannot ban it yet.
	Attested bool
	// Carriers are registrations other than the node's own (and other
	// than the entries this plan deletes) that carry the agent: parented
	// to it, or parented to the server with selectors it has. At most a
	// few are listed.
	Carriers []Entry
}

// Suspects are the nodes whose agents a plan must look for: the withdrawn
// ones, and the retired ones (whose agents are banned on sight).
func Suspects(doc export.Document, p Plan) []export.Device {
	byID := map[string]export.Device{}
	for _, d := range doc.Retired {
		byID[d.NodeID] = d
	}
	for _, n := range p.Withdrawn {
		if _, ok := byID[n]; ok {
			continue
		}
		// A node that left the export altogether: its selectors are those
		// of the entries deleted.
		d := export.Device{NodeID: n}
		for _, c := range p.Delete {
			if c.NodeID == n {
				d.SPIFFEID = c.Entry.SPIFFEID
				d.Agents = append(d.Agents, export.AgentMatch{Attestor: attestorOf(c.Entry.ID), Selectors: c.Entry.Selectors})
			}
		}
		byID[n] = d
	}
	out := make([]export.Device, 0, len(byID))
	for _, d := range byID {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b export.Device) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out
}

func attestorOf(entryID string) string {
	parts := strings.SplitN(entryID, ".", 3)
	if len(parts) == 3 && parts[0] == "nodetrust" {
		return parts[1]
	}
	return ""
}

// Bans completes p with the agents found for the suspects (by node id):
// a retired node's attested agents are banned on sight; a withdrawn
// node's are banned unless another registration still carries them.
// Agents already banned need nothing; a retired node with no attested
// agent is pending.
func Bans(doc export.Document, p Plan, found map[string][]Agent) Plan {
	retired := map[string]bool{}
	for _, d := range doc.Retired {
		retired[d.NodeID] = true
	}
	deleted := map[string]bool{}
	for _, c := range p.Delete {
		deleted[c.Entry.ID] = true
	}
	for _, d := range Suspects(doc, p) {
		agents := found[d.NodeID]
		attested := false
		for _, a := range agents {
			if !a.Attested {
				if retired[d.NodeID] {
					p.Pending = append(p.Pending, Pending{NodeID: d.NodeID, AgentID: a.ID})
				}
				continue
			}
			attested = true
			if a.Banned {
				continue
			}
			if retired[d.NodeID] {
				p.Ban = append(p.Ban, Ban{NodeID: d.NodeID, AgentID: a.ID, Why: "retired"})
				continue
			}
			if by := carrier(a, d.SPIFFEID, deleted); by != "" {
				p.Kept = append(p.Kept, Kept{NodeID: d.NodeID, AgentID: a.ID, CarriedBy: by})
				continue
			}
			p.Ban = append(p.Ban, Ban{NodeID: d.NodeID, AgentID: a.ID, Why: "left the export"})
		}
		if retired[d.NodeID] && !attested && !slices.ContainsFunc(p.Pending, func(x Pending) bool { return x.NodeID == d.NodeID }) {
			p.Pending = append(p.Pending, Pending{NodeID: d.NodeID})
		}
	}
	return p
}

// carrier names a registration other than the node's own, and not one
// this plan deletes, that still carries the agent ("" when none does).
func carrier(a Agent, nodeSPIFFEID string, deleted map[string]bool) string {
	for _, e := range a.Carriers {
		if deleted[e.ID] || e.SPIFFEID == nodeSPIFFEID {
			continue
		}
		return fmt.Sprintf("entry %s (%s)", e.ID, e.SPIFFEID)
	}
	return ""
}
