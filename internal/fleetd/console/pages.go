package console

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
)

// callTimeout bounds each Admin call a page makes.
const callTimeout = 15 * time.Second

func callCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), callTimeout)
}

// Thresholds of the fleet page's highlights.
const (
	// expiringWithin marks a certificate that ends soon (a node renews at
	// 60% of a lifetime of at most 24 h, so one this close has missed
	// its renewals).
	expiringWithin = time.Hour
	// staleAfter marks a node not seen for this long.
	staleAfter = 24 * time.Hour
)

// nodeRow is one line of the fleet table. Hostname and the other claimed
// fields are the machine's word (attacker-controlled): they are only ever
// shown as escaped text.
type nodeRow struct {
	ID, Hostname, Role, Site, Class, Attestor string
	State                                     state
	LastSeen                                  int64
	LastSeenAgo                               string
	CertNotAfter                              int64
	// Warnings are the highlights, each in words.
	Warnings []string
	Declared bool
}

type count struct {
	Name  string
	Icon  string
	N     int
	Query string
}

type fleetView struct {
	Rows                 []nodeRow
	Total, Shown         int
	States, Classes      []count
	State, Class, Search string
	Errors               []string
}

func (c *Console) fleetPage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := callCtx(r)
	defer cancel()
	nodes, err := c.cfg.Admin.ListNodes(ctx, &adminv1.ListNodesRequest{})
	if err != nil {
		c.apiError(w, s, "list the nodes", err)
		return
	}
	now := c.cfg.Now()
	v := fleetView{State: r.URL.Query().Get("state"), Class: r.URL.Query().Get("class"), Search: strings.TrimSpace(r.URL.Query().Get("q"))}
	var rows []nodeRow
	seen := map[string]bool{}
	for _, n := range nodes.Nodes {
		seen[n.Id] = true
		rows = append(rows, c.row(n, now))
	}
	// Declared devices without a node record (planned) come from the
	// inventory.
	if decls, err := c.cfg.Admin.ListDeclarations(ctx, &adminv1.ListDeclarationsRequest{}); err != nil {
		v.Errors = append(v.Errors, "declared devices not shown: "+status.Convert(err).Message())
	} else {
		for _, d := range decls.Declarations {
			if seen[d.Name] {
				continue
			}
			rows = append(rows, nodeRow{ID: d.Name, Role: d.Role, Site: d.Site, Class: d.Class, State: stateOf(orPlanned(d.State)), LastSeenAgo: "never", Declared: true})
		}
	}
	states, classes := map[string]int{}, map[string]int{}
	for _, row := range rows {
		states[row.State.Name]++
		classes[row.Class]++
	}
	for _, st := range stateOrder {
		v.States = append(v.States, count{Name: st, Icon: stateIcons[st], N: states[st]})
	}
	for st, n := range states {
		if !slices.Contains(stateOrder, st) {
			v.States = append(v.States, count{Name: st, Icon: stateOf(st).Icon, N: n})
		}
	}
	for cl, n := range classes {
		name := cl
		if name == "" {
			name = "(undeclared)"
		}
		v.Classes = append(v.Classes, count{Name: name, N: n, Query: cl})
	}
	slices.SortFunc(v.Classes, func(a, b count) int { return strings.Compare(a.Name, b.Name) })
	v.Total = len(rows)
	q := strings.ToLower(v.Search)
	for _, row := range rows {
		if v.State != "" && row.State.Name != v.State {
			continue
		}
		if r.URL.Query().Has("class") && row.Class != v.Class {
			continue
		}
		if q != "" && !matches(row, q) {
			continue
		}
		v.Rows = append(v.Rows, row)
	}
	// Most recently seen first; never seen last, by id.
	slices.SortStableFunc(v.Rows, func(a, b nodeRow) int {
		if a.LastSeen != b.LastSeen {
			if a.LastSeen > b.LastSeen {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	v.Shown = len(v.Rows)
	c.render(w, http.StatusOK, s, "fleet", "Fleet", "fleet", v)
}

func orPlanned(st string) string {
	if st == "" {
		return "planned"
	}
	return st
}

func matches(row nodeRow, q string) bool {
	for _, f := range []string{row.ID, row.Hostname, row.Role, row.Site, row.Class, row.Attestor} {
		if strings.Contains(strings.ToLower(f), q) {
			return true
		}
	}
	return false
}

// row makes a fleet table row of n, with its highlights.
func (c *Console) row(n *adminv1.Node, now time.Time) nodeRow {
	row := nodeRow{ID: n.Id, Hostname: n.Hostname, Role: n.Role, Site: n.Site, Class: n.Class, Attestor: n.Attestor,
		State: stateOf(n.State), LastSeen: n.LastSeenUnix, CertNotAfter: n.CertNotAfterUnix, LastSeenAgo: "never"}
	if n.LastSeenUnix != 0 {
		row.LastSeenAgo = ago(now.Sub(time.Unix(n.LastSeenUnix, 0)))
	}
	row.Warnings = warnings(n, now)
	return row
}

// warnings are a node's highlights: an expired or expiring certificate,
// a node not seen for long. Retired and revoked nodes have none.
func warnings(n *adminv1.Node, now time.Time) []string {
	if n.State == "retired" || n.State == "revoked" {
		return nil
	}
	var out []string
	if n.CertNotAfterUnix != 0 {
		left := time.Unix(n.CertNotAfterUnix, 0).Sub(now)
		switch {
		case left <= 0:
			out = append(out, "certificate expired "+ago(-left))
		case left < expiringWithin:
			out = append(out, "certificate expires "+ago(-left))
		}
	}
	if n.LastSeenUnix != 0 && now.Sub(time.Unix(n.LastSeenUnix, 0)) > staleAfter {
		out = append(out, "not seen for "+strings.TrimSuffix(ago(now.Sub(time.Unix(n.LastSeenUnix, 0))), " ago"))
	}
	return out
}

// action is a button of the node page.
type action struct {
	Name, Label, Help string
}

type nodeView struct {
	ID          string
	Node        *adminv1.Node
	Row         nodeRow
	Declaration *adminv1.Declaration
	History     []*adminv1.StateChange
	Audit       []*adminv1.AuditEvent
	Changes     []*adminv1.FieldChange
	Verdicts    []Verdict
	VerdictNote string
	Certs       []certRow
	CertNote    string
	Actions     []action
	Errors      []string
}

func (c *Console) nodePage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	ctx, cancel := callCtx(r)
	defer cancel()
	v := nodeView{ID: id}
	got, err := c.cfg.Admin.GetNode(ctx, &adminv1.GetNodeRequest{Id: id})
	switch {
	case err == nil:
		v.Node = got.Node
		v.Row = c.row(got.Node, c.cfg.Now())
	case status.Code(err) != codes.NotFound:
		c.apiError(w, s, "read node "+id, err)
		return
	}
	if decls, err := c.cfg.Admin.ListDeclarations(ctx, &adminv1.ListDeclarationsRequest{}); err != nil {
		v.Errors = append(v.Errors, "declaration not shown: "+status.Convert(err).Message())
	} else {
		for _, d := range decls.Declarations {
			if d.Name == id {
				v.Declaration = d
				break
			}
		}
	}
	if v.Node == nil && v.Declaration == nil {
		c.render(w, http.StatusNotFound, s, "message", "Not found", "fleet", "There is no node or declared device "+id+".")
		return
	}
	if v.Node == nil {
		v.Row = nodeRow{ID: id, State: stateOf(orPlanned(v.Declaration.State)), Class: v.Declaration.Class, Declared: true}
	}
	if h, err := c.cfg.Admin.NodeHistory(ctx, &adminv1.NodeHistoryRequest{Id: id}); err != nil {
		v.Errors = append(v.Errors, "state history not shown: "+status.Convert(err).Message())
	} else {
		v.History = h.Changes
	}
	if a, err := c.cfg.Admin.ListAudit(ctx, &adminv1.ListAuditRequest{Subject: id, Limit: 50}); err != nil {
		v.Errors = append(v.Errors, "audit not shown: "+status.Convert(err).Message())
	} else {
		v.Audit = a.Events
	}
	if ch, err := c.cfg.Admin.ListChanges(ctx, &adminv1.ListChangesRequest{Device: id, Limit: 50}); err != nil {
		v.Errors = append(v.Errors, "inventory changes not shown: "+status.Convert(err).Message())
	} else {
		v.Changes = ch.Changes
	}
	v.Verdicts, v.VerdictNote = c.verdicts(ctx, id)
	if v.Node != nil {
		v.Certs, v.CertNote = c.certs(ctx, id, v.Node.CertSerial, c.cfg.Now())
	}
	v.Actions = c.actionsFor(v.Row.State.Name, v.Node != nil)
	c.render(w, http.StatusOK, s, "node", "Node "+id, "fleet", v)
}

// actions are the node actions the console offers, by name.
var actions = map[string]action{
	"release":    {"release", "Release quarantine", "The node becomes active and renews again."},
	"quarantine": {"quarantine", "Quarantine", "No renewal and no re-join until released; the certificate and session stay."},
	"revoke":     {"revoke", "Revoke", "Raises the identity generation, revokes its certificates and ends its live session."},
	"retire":     {"retire", "Retire", "Revokes it for good: it never renews or re-joins; it comes back only declared again under a new name."},
	"approve":    {"approve", "Approve join", "Lets the pending joins of this node id complete."},
}

// actionNeeds is the role rule of each action: the lifecycle's own for
// its transitions, and the Admin API's for revocation and approval. It
// only decides which buttons are shown; the API decides.
var actionNeeds = map[string]roles.Action{
	"release": lifecycle.Release.Action, "quarantine": lifecycle.Quarantine.Action, "retire": lifecycle.Retire.Action,
	"revoke": roles.Lifecycle, "approve": roles.Lifecycle,
}

// actionsFor lists the actions the console's role may take on a node in
// state st.
func (c *Console) actionsFor(st string, record bool) []action {
	var names []string
	switch st {
	case "quarantined":
		names = []string{"release", "revoke", "retire"}
	case "active", "provisioning":
		names = []string{"quarantine", "revoke", "retire"}
	case "revoked":
		names = []string{"retire"}
	case "planned":
		names = []string{"retire"}
	}
	var out []action
	for _, n := range names {
		if n == "revoke" && !record {
			continue
		}
		if c.may(n) {
			out = append(out, actions[n])
		}
	}
	return out
}

// may reports whether the console's role may take the action (so that
// its button is shown).
func (c *Console) may(name string) bool {
	a, ok := actionNeeds[name]
	return ok && c.cfg.Role.May(a)
}

type pendingView struct {
	Pending    []*adminv1.PendingJoin
	Claims     []*adminv1.Claim
	MayApprove bool
	Errors     []string
}

func (c *Console) pendingPage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := callCtx(r)
	defer cancel()
	p, err := c.cfg.Admin.ListPending(ctx, &adminv1.ListPendingRequest{})
	if err != nil {
		c.apiError(w, s, "list pending joins", err)
		return
	}
	v := pendingView{Pending: p.Pending, MayApprove: c.may("approve")}
	if cl, err := c.cfg.Admin.ListClaims(ctx, &adminv1.ListClaimsRequest{Limit: 200}); err != nil {
		v.Errors = append(v.Errors, "claims not shown: "+status.Convert(err).Message())
	} else {
		v.Claims = cl.Claims
	}
	c.render(w, http.StatusOK, s, "pending", "Pending approvals and claims", "pending", v)
}

type auditView struct {
	Events      []*adminv1.AuditEvent
	Reads       bool
	HiddenReads int
}

// readMethods are the Admin methods that change nothing; their
// admin.call events are hidden unless asked for (the console's own pages
// make many).
func isRead(e *adminv1.AuditEvent) bool {
	if e.Action != "admin.call" {
		return false
	}
	return strings.HasPrefix(e.Subject, "List") || strings.HasPrefix(e.Subject, "Get") || e.Subject == "NodeHistory"
}

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := callCtx(r)
	defer cancel()
	a, err := c.cfg.Admin.ListAudit(ctx, &adminv1.ListAuditRequest{Limit: 500})
	if err != nil {
		c.apiError(w, s, "list the audit trail", err)
		return
	}
	v := auditView{Reads: r.URL.Query().Get("reads") == "1"}
	for _, e := range a.Events {
		if !v.Reads && isRead(e) {
			v.HiddenReads++
			continue
		}
		v.Events = append(v.Events, e)
	}
	c.render(w, http.StatusOK, s, "audit", "Audit", "audit", v)
}

// apiError answers a page whose Admin call failed, saying what the
// control plane said.
func (c *Console) apiError(w http.ResponseWriter, s *session, what string, err error) {
	st := status.Convert(err)
	code := http.StatusBadGateway
	switch st.Code() {
	case codes.PermissionDenied:
		code = http.StatusForbidden
	case codes.NotFound:
		code = http.StatusNotFound
	case codes.FailedPrecondition, codes.AlreadyExists:
		code = http.StatusConflict
	case codes.InvalidArgument:
		code = http.StatusBadRequest
	case codes.Unauthenticated:
		code = http.StatusUnauthorized
	}
	msg := "The control plane refused to " + what + ": " + st.Message() + " (" + st.Code().String() + ")."
	if code == http.StatusBadGateway {
		msg = "The control plane did not answer the call to " + what + ": " + st.Message() + " (" + st.Code().String() + "). Is fleetd serving?"
	}
	c.render(w, code, s, "message", "Refused", "", msg)
}
