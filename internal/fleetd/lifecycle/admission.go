package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Admission applies the lifecycle's rules to a join before anything is
// issued (seed 003, "Declaration and boot"): which declared device a
// machine is, whether its EK binding was written by a declarer, whether it
// is provisioned, and whether its state allows a join at all.
type Admission struct {
	Store  store.Store
	Source inventory.Source
	// Required makes every join of a machine the inventory does not
	// declare (by serial, product UUID or EK binding) wait as a claim.
	Required bool
	// AutoProvision lets a planned worker's first join start its
	// provisioning; never a control plane's or another class's.
	AutoProvision bool
}

// Request is what a join proved and claimed.
type Request struct {
	// Attestor is "token" or "tpm".
	Attestor string
	// EKPin is the pin of the EK a tpm join proved (credential activation
	// and quote checked); empty for a token join.
	EKPin string
	// Token is the join token that opened for this request, or nil.
	Token *store.Token
	// Claims are the machine's claims: they select a declaration, they
	// prove nothing.
	Claims store.Claims
	// AskedNodeID is the node id the join asks for ("" for none).
	AskedNodeID string
}

// Kind is what Decide found the machine to be.
type Kind int

const (
	// Undeclared: no declaration matches and none is required; the
	// service's own rules (tokens, reclaim) apply, and CheckRejoin to a
	// node they find.
	Undeclared Kind = iota
	// Declared: the machine is Outcome.Decl's device, planned or
	// provisioning; the join makes it active.
	Declared
	// Known: the machine is Outcome.Node, by the EK fleetd proved for it;
	// the join re-joins it.
	Known
)

// Outcome is Decide's answer for a join it admits.
type Outcome struct {
	Kind Kind
	// Decl is the declaration of a Declared device.
	Decl *store.Declaration
	// Node is the node record the join replaces (nil when there is none:
	// a planned device, or a new node).
	Node *store.Node
	// From is the state the node leaves (planned for a declared device
	// without a record).
	From string
	// History are the state changes before the join's own (a planned
	// device's provisioning by auto-provision or by its token).
	History []store.StateChange
	// Why says on what authority the machine is admitted, for the audit.
	Why string
}

// Refusal is a join the lifecycle refuses; the wire says "Join refused".
// Claim says the machine waits as a claim (fleetd claims list), and
// Declared names the declaration its claims matched.
type Refusal struct {
	Reason   string
	Claim    bool
	Declared string
}

func (r *Refusal) Error() string { return r.Reason }

func refuse(claim bool, declared, format string, args ...any) *Refusal {
	return &Refusal{Reason: fmt.Sprintf(format, args...), Claim: claim, Declared: declared}
}

// ErrSourceUnavailable wraps a failure of the inventory source: the join is
// refused and nothing already issued changes (seed 003, "NetBox cannot
// answer").
var ErrSourceUnavailable = errors.New("the inventory source cannot answer")

// CheckRejoin applies the state rules to a join of an existing node n
// (docs/lifecycle.md): a quarantined or retired node never re-joins; a
// node held to an EK re-joins only with that TPM (ekPin is the EK a tpm
// join proved); a token re-join needs a token that allows reclaim.
func CheckRejoin(n store.Node, attestor, ekPin string, allowReclaim bool) *Refusal {
	switch n.State {
	case store.StateQuarantined:
		return refuse(false, "", "node %s is quarantined: no re-join by token or TPM until fleetd nodes release %s", n.ID, n.ID)
	case store.StateRetired:
		return refuse(false, "", "node %s is retired: it comes back only declared again under a new name", n.ID)
	}
	if attestor == "tpm" && n.EKPin != "" && n.EKPin != ekPin {
		return refuse(true, "", "a substitute TPM: node %s is held to EK %s, which fleetd proved; this machine proved EK %s", n.ID, n.EKPin, ekPin)
	}
	if attestor == "token" && n.EKPin != "" {
		return refuse(false, "", "node %s is held to EK %s: it re-joins only with that TPM (bcd join --reset --yes --attestor tpm)", n.ID, n.EKPin)
	}
	// Only the TPM fleetd proved for the node re-joins it without a token
	// that allows reclaim.
	if provenTPM := attestor == "tpm" && n.EKPin != "" && n.EKPin == ekPin; !provenTPM && !allowReclaim {
		return refuse(false, "", "machine is already known as node %s (same product UUID or serial); the token does not allow reclaim", n.ID)
	}
	return nil
}

// Decide finds which machine a join is and whether the lifecycle admits
// it. It returns a *Refusal for a join it refuses, an error wrapping
// ErrSourceUnavailable when the inventory source cannot answer, and other
// errors for store failures.
func (a *Admission) Decide(ctx context.Context, r Request) (Outcome, error) {
	if r.EKPin != "" {
		n, err := a.Store.NodeByEKPin(ctx, r.EKPin)
		switch {
		case err == nil && n.State != store.StateRetired:
			if rf := CheckRejoin(n, "tpm", r.EKPin, true); rf != nil {
				return Outcome{}, rf
			}
			if a.Required {
				if _, err := a.Source.Get(ctx, n.ID); errors.Is(err, store.ErrNotFound) {
					return Outcome{}, refuse(true, "", "node %s is not declared and the inventory is required", n.ID)
				} else if err != nil {
					return Outcome{}, fmt.Errorf("%w: %v", ErrSourceUnavailable, err)
				}
			}
			return Outcome{Kind: Known, Node: &n, From: n.State, Why: "the EK fleetd proved for it"}, nil
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return Outcome{}, fmt.Errorf("look up EK %s: %w", r.EKPin, err)
		}
	}

	cands, err := a.candidates(ctx, r)
	if err != nil {
		return Outcome{}, err
	}
	if len(cands) == 0 {
		if a.Required {
			return Outcome{}, refuse(true, "", "no declaration matches the machine (serial, product UUID or EK) and the inventory is required")
		}
		return Outcome{Kind: Undeclared}, nil
	}
	if len(cands) > 1 {
		names := make([]string, len(cands))
		for i, c := range cands {
			names[i] = c.decl.Name
		}
		return Outcome{}, refuse(true, "", "the machine matches several declarations: %s", strings.Join(names, ", "))
	}
	c := cands[0]
	d, n := c.decl, c.node
	state := store.StatePlanned
	if n != nil {
		state = n.State
	}
	if r.Attestor == "tpm" {
		return a.decideTPM(ctx, r, d, n, state)
	}
	return a.decideToken(r, d, n, state)
}

type candidate struct {
	decl store.Declaration
	node *store.Node
}

// candidates are the declarations the machine may be, whose node is not
// retired: by EK binding, by claims, and by the node id asked for.
func (a *Admission) candidates(ctx context.Context, r Request) ([]candidate, error) {
	var ds []store.Declaration
	if r.EKPin != "" {
		byEK, err := a.Source.ByEKPin(ctx, r.EKPin)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSourceUnavailable, err)
		}
		ds = append(ds, byEK...)
	}
	byClaims, err := a.Source.ByClaims(ctx, r.Claims.ProductUUID, r.Claims.Serials)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSourceUnavailable, err)
	}
	ds = append(ds, byClaims...)
	for _, id := range []string{r.AskedNodeID, tokenNode(r.Token)} {
		if id == "" {
			continue
		}
		d, err := a.Source.Get(ctx, id)
		switch {
		case err == nil:
			ds = append(ds, d)
		case !errors.Is(err, store.ErrNotFound):
			return nil, fmt.Errorf("%w: %v", ErrSourceUnavailable, err)
		}
	}
	var out []candidate
	seen := map[string]bool{}
	for _, d := range ds {
		if seen[d.Name] {
			continue
		}
		seen[d.Name] = true
		n, err := a.Store.GetNode(ctx, d.Name)
		switch {
		case errors.Is(err, store.ErrNotFound):
			out = append(out, candidate{decl: d})
		case err != nil:
			return nil, fmt.Errorf("look up node %s: %w", d.Name, err)
		case n.State != store.StateRetired:
			out = append(out, candidate{decl: d, node: &n})
		}
	}
	return out, nil
}

func tokenNode(t *store.Token) string {
	if t == nil {
		return ""
	}
	return t.NodeID
}

// DecideIntake finds the declared device an intake is (seed 003,
// "Attestation and admission") before anything is issued: exactly one
// declaration matches the machine (by the binding of the EK it proved, or
// its claims), its node is planned or provisioning (or has no record
// yet), and its binding names the proven EK and was written by a
// declarer. Unlike Decide it does not ask for provisioning: intake issues
// device certificates and authorizes no installation. It returns the
// declaration and why the binding is honoured, a *Refusal, an error
// wrapping ErrSourceUnavailable, or a store error.
func (a *Admission) DecideIntake(ctx context.Context, ekPin string, claims store.Claims) (store.Declaration, string, error) {
	if ekPin == "" {
		return store.Declaration{}, "", errors.New("decide intake: no proven EK")
	}
	cands, err := a.candidates(ctx, Request{Attestor: "tpm", EKPin: ekPin, Claims: claims})
	if err != nil {
		return store.Declaration{}, "", err
	}
	switch len(cands) {
	case 0:
		return store.Declaration{}, "", refuse(true, "", "no declaration matches the machine (serial, product UUID or EK %s): intake is only for declared machines", ekPin)
	case 1:
	default:
		names := make([]string, len(cands))
		for i, c := range cands {
			names[i] = c.decl.Name
		}
		return store.Declaration{}, "", refuse(true, "", "the machine matches several declarations: %s", strings.Join(names, ", "))
	}
	d, n := cands[0].decl, cands[0].node
	state := store.StatePlanned
	if n != nil {
		state = n.State
	}
	if state != store.StatePlanned && state != store.StateProvisioning {
		return store.Declaration{}, "", refuse(true, d.Name, "%s is %s: intake is for planned or provisioning devices (an installed node re-joins with bcd join --attestor tpm; one to install anew is retired and declared again)", d.Name, state)
	}
	why, err := a.checkBinding(ctx, ekPin, d, n, state)
	if err != nil {
		return store.Declaration{}, "", err
	}
	return d, why, nil
}

// checkBinding applies the rules of a declared device's EK binding to a
// proven EK: the node (if any) is not held to another EK, the device is
// planned or provisioning, its binding names the EK, and a declarer wrote
// it. It returns why the binding is honoured.
func (a *Admission) checkBinding(ctx context.Context, ekPin string, d store.Declaration, n *store.Node, state string) (string, error) {
	if n != nil && n.EKPin != "" && n.EKPin != ekPin {
		return "", refuse(true, d.Name, "a substitute TPM: %s is held to EK %s, which fleetd proved; this machine proved EK %s", d.Name, n.EKPin, ekPin)
	}
	if state != store.StatePlanned && state != store.StateProvisioning {
		return "", refuse(true, d.Name, "%s is %s and fleetd never proved its TPM: its binding authorizes nothing past planned (re-join it by token with --allow-reclaim, or retire it and declare it anew)", d.Name, state)
	}
	if len(d.EKPins) == 0 {
		return "", refuse(true, d.Name, "%s is planned without an EK binding: it waits until a declarer binds its EK", d.Name)
	}
	if !slices.Contains(d.EKPins, ekPin) {
		return "", refuse(true, d.Name, "the machine claims to be %s, whose binding names other EKs than %s (a copied serial?)", d.Name, ekPin)
	}
	auth, err := a.Source.Binding(ctx, d)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrSourceUnavailable, err)
	}
	if !auth.Honoured {
		return "", refuse(true, d.Name, "%s", auth.Why)
	}
	return auth.Why, nil
}

func (a *Admission) decideTPM(ctx context.Context, r Request, d store.Declaration, n *store.Node, state string) (Outcome, error) {
	why, err := a.checkBinding(ctx, r.EKPin, d, n, state)
	if err != nil {
		return Outcome{}, err
	}
	out := Outcome{Kind: Declared, Decl: &d, Node: n, From: state, Why: "EK binding " + why}
	if state == store.StatePlanned {
		switch {
		case r.Token != nil:
			out.History = []store.StateChange{provisioned(d.Name, "token:"+r.Token.ID+" (created by "+r.Token.CreatedBy+")", "a join token authorized the first installation")}
		case a.AutoProvision && d.Class == ClassWorker:
			out.History = []store.StateChange{provisioned(d.Name, "fleetd", "auto-provision of a worker's first installation")}
		default:
			why := "auto-provision is off"
			if a.AutoProvision {
				why = "auto-provision starts only a worker's, and " + d.Name + " is of class " + d.Class
			}
			return Outcome{}, refuse(true, d.Name, "%s is planned and not provisioned (%s): fleetd nodes provision %s", d.Name, why, d.Name)
		}
	}
	return out, nil
}

func (a *Admission) decideToken(r Request, d store.Declaration, n *store.Node, state string) (Outcome, error) {
	if r.Token == nil {
		return Outcome{}, refuse(false, d.Name, "a join of %s without a token", d.Name)
	}
	tok := r.Token
	if n != nil && n.State == store.StateQuarantined {
		rf := CheckRejoin(*n, "token", "", true)
		rf.Declared = d.Name
		return Outcome{}, rf
	}
	if len(d.EKPins) > 0 || (n != nil && n.EKPin != "") {
		return Outcome{}, refuse(false, d.Name, "%s is held to an EK: it joins only with its TPM (bcd join --attestor tpm)", d.Name)
	}
	if tok.NodeID != "" && tok.NodeID != d.Name {
		return Outcome{}, refuse(false, d.Name, "the machine is declared as %s, the token is for node %s", d.Name, tok.NodeID)
	}
	if r.AskedNodeID != "" && r.AskedNodeID != d.Name {
		return Outcome{}, refuse(false, d.Name, "the machine is declared as %s, the join asks for node %s", d.Name, r.AskedNodeID)
	}
	if role := DeclaredRole(d); tok.Role != role {
		return Outcome{}, refuse(false, d.Name, "the token is for role %q, %s is declared with role %q", tok.Role, d.Name, role)
	}
	if tok.Site != "" && d.Site != "" && tok.Site != d.Site {
		return Outcome{}, refuse(false, d.Name, "the token is for site %q, %s is declared at site %q", tok.Site, d.Name, d.Site)
	}
	switch state {
	case store.StatePlanned:
		return Outcome{Kind: Declared, Decl: &d, From: state, Why: "join token " + tok.ID,
			History: []store.StateChange{provisioned(d.Name, "token:"+tok.ID+" (created by "+tok.CreatedBy+")", "a join token authorized the first installation")}}, nil
	case store.StateProvisioning:
		return Outcome{Kind: Declared, Decl: &d, Node: n, From: state, Why: "join token " + tok.ID}, nil
	}
	if rf := CheckRejoin(*n, "token", "", tok.AllowReclaim); rf != nil {
		rf.Declared = d.Name
		return Outcome{}, rf
	}
	return Outcome{Kind: Known, Decl: &d, Node: n, From: state, Why: "join token " + tok.ID + " allowing reclaim"}, nil
}

// DeclaredRole is the role a declared device's certificate carries: its
// declared role, else its class.
func DeclaredRole(d store.Declaration) string {
	if d.Role != "" {
		return d.Role
	}
	return d.Class
}

func provisioned(id, actor, reason string) store.StateChange {
	return store.StateChange{NodeID: id, From: store.StatePlanned, To: store.StateProvisioning, Actor: actor, Reason: reason}
}

// ClaimKey is the key a machine's claim is kept under: its proven EK, else
// its product UUID, first serial or hostname.
func ClaimKey(ekPin string, c store.Claims) string {
	switch {
	case ekPin != "":
		return "ek:" + ekPin
	case c.ProductUUID != "":
		return "uuid:" + c.ProductUUID
	case len(c.Serials) > 0:
		return "serial:" + c.Serials[0]
	case c.Hostname != "":
		return "host:" + c.Hostname
	}
	return ""
}
