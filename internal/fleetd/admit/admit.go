// Package admit decides whether a machine that passed intake may be
// installed (seed 003, "Attestation and admission" and "Installation and
// config release"): a declared device whose declaration is complete, in a
// state that allows installation, with a recent network report signed by
// its device key that matches its declared switch port, and an authority
// for the provision — an unfinished provision (the owner's `fleetd nodes
// provision` among them), or auto-provision of a worker's first install.
// A certificate alone never authorizes installation.
//
// It is a library: it reads the inventory and the node records, and
// returns a Decision or a *Refusal naming the rule (and field) that
// refused. The caller (the service) verifies the LDevID and the signed
// confirmation, writes the Decision's provision, logs and audits the
// refusal, and sends Refusal.Wire to the node.
package admit

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki/netreport"
)

// Rule names what refused an installation, for the server's log and audit.
type Rule string

// The rules, in the order Decide applies them.
const (
	// RuleInventory: the inventory source could not answer.
	RuleInventory Rule = "inventory-unavailable"
	// RuleDeclared: no declaration of that name.
	RuleDeclared Rule = "declared"
	// RuleComplete: a required field of the declaration is empty
	// (Refusal.Field names it; see Required).
	RuleComplete Rule = "declaration-complete"
	// RuleBinding: the EK binding is not a declarer's, or does not name
	// the EK the intake session proved.
	RuleBinding Rule = "ek-binding"
	// RuleState: the device is neither planned nor provisioning.
	RuleState Rule = "state"
	// RuleReportMissing: no network report came with the request.
	RuleReportMissing Rule = "network-report"
	// RuleReportSignature: the report is malformed or not signed by the
	// device key.
	RuleReportSignature Rule = "network-report-signature"
	// RuleReportAge: the report is older than MaxReportAge.
	RuleReportAge Rule = "network-report-age"
	// RuleReportFuture: the report is dated later than now plus MaxSkew.
	RuleReportFuture Rule = "network-report-future"
	// RulePort: the report's switch chassis or port is not the declared
	// expected port (Field names which).
	RulePort Rule = "expected-port"
	// RuleProvision: a planned device with no authority for its
	// provision (auto-provision off, or not a worker's first install).
	RuleProvision Rule = "provision"
	// RuleControlPlane: a control plane without the owner's explicit
	// provision; it is never provisioned automatically.
	RuleControlPlane Rule = "control-plane-explicit-provision"
)

// Refusal is an installation Decide refuses. Error is for the server's log
// and audit (it names the rule, the field and what was found); Wire is
// what the node is told: what to do, without the inventory's content.
type Refusal struct {
	Rule Rule
	// Field names the declaration's or the report's field at fault, when
	// one is (inventory field names: "expected_port.port").
	Field  string
	Device string
	// Reason says what was found, for the server.
	Reason string
	// Do says what to do, for the node and its operator.
	Do string
	// Err is the cause, when another error is (the inventory source's).
	Err error
}

func (r *Refusal) Error() string {
	s := "install of " + r.Device + " refused by rule " + string(r.Rule)
	if r.Field != "" {
		s += " (field " + r.Field + ")"
	}
	return s + ": " + r.Reason
}

// Unwrap returns the cause.
func (r *Refusal) Unwrap() error { return r.Err }

// Wire is the refusal's text for the node.
func (r *Refusal) Wire() string { return "Install refused: " + r.Do }

// Requirement is one field a declaration needs before installation.
type Requirement struct {
	// Field is the inventory's name of the field.
	Field string
	// Missing reports whether d lacks it.
	Missing func(d store.Declaration) bool
}

// Required is the one list of what a complete declaration has: the fields
// the install needs (its class picks the renderer and the provision rule;
// serial or product UUID is what the intake matched; the expected port is
// what the network report is compared with; the EK binding is what made
// the intake's TPM this device's). A field the renderer needs is added
// here, so a declaration that cannot render is refused before any install
// code is issued.
var Required = []Requirement{
	{inventory.FieldClass, func(d store.Declaration) bool { return d.Class == "" }},
	{inventory.FieldSerial + " or " + inventory.FieldProductUUID, func(d store.Declaration) bool { return d.Serial == "" && d.ProductUUID == "" }},
	{inventory.FieldSwitchChassis, func(d store.Declaration) bool { return d.SwitchChassis == "" }},
	{inventory.FieldSwitchPort, func(d store.Declaration) bool { return d.SwitchPort == "" }},
	{inventory.FieldEKPins, func(d store.Declaration) bool { return len(d.EKPins) == 0 }},
	{inventory.FieldEKSource, func(d store.Declaration) bool { return d.EKSource == "" }},
	{inventory.FieldInstallDisk, func(d store.Declaration) bool { return d.InstallDisk == "" }},
}

// Missing returns the first required field d lacks, or "".
func Missing(d store.Declaration) string {
	for _, r := range Required {
		if r.Missing(d) {
			return r.Field
		}
	}
	return ""
}

// Defaults of the report's bounds.
const (
	DefaultMaxReportAge = 15 * time.Minute
	DefaultMaxSkew      = 2 * time.Minute
)

// AutoActor is the actor of a provision fleetd starts by itself (the
// lifecycle's auto-provision): it never counts as the owner's explicit
// provision.
const AutoActor = "fleetd"

// Nodes reads node records and their history (store.Store has both).
type Nodes interface {
	GetNode(ctx context.Context, id string) (store.Node, error)
	NodeHistory(ctx context.Context, id string) ([]store.StateChange, error)
}

// Admitter holds the rules' settings.
type Admitter struct {
	Source inventory.Source
	Nodes  Nodes
	// MaxReportAge bounds how old a network report may be
	// (DefaultMaxReportAge when zero); MaxSkew how far in the future it
	// may be dated (DefaultMaxSkew when zero).
	MaxReportAge time.Duration
	MaxSkew      time.Duration
	// AutoProvision lets a planned worker's first install start its
	// provision; never a control plane's or another class's.
	AutoProvision bool
	// ControlPlaneClasses and ControlPlaneRoles name the declarations
	// that install as control planes, by class or by declared role
	// (the renderers pick a control-plane config by role). Both default
	// to {"control-plane"}; the class control-plane always counts. A
	// declaration matched by either never installs without the owner's
	// explicit provision, whatever its class says.
	ControlPlaneClasses []string
	ControlPlaneRoles   []string
}

// controlPlane says whether d installs as a control plane: by its class
// or by its declared role, so that a worker-class declaration whose role
// renders a control-plane config is not auto-provisioned as a worker.
func (a *Admitter) controlPlane(d store.Declaration) bool {
	classes, roles := a.ControlPlaneClasses, a.ControlPlaneRoles
	if classes == nil {
		classes = []string{lifecycle.ClassControlPlane}
	}
	if roles == nil {
		roles = []string{lifecycle.ClassControlPlane}
	}
	return d.Class == lifecycle.ClassControlPlane || slices.Contains(classes, d.Class) || (d.Role != "" && slices.Contains(roles, d.Role))
}

// Request is what the service verified of a request for installation.
type Request struct {
	// Device is the declared name the intake session is for.
	Device string
	// EKPin is the EK the intake session proved.
	EKPin string
	// DeviceKey is the public key of the device's LDevID, whose chain
	// and confirmation signature the caller verified.
	DeviceKey crypto.PublicKey
	// Report is the signed network report; nil when none came.
	Report *netreport.Signed
	Now    time.Time
}

// Decision is an admitted installation.
type Decision struct {
	Decl store.Declaration
	// From is the device's state: planned or provisioning.
	From string
	// Provision, when not nil, is the change the caller writes before it
	// issues an install code: a planned worker's auto-provision.
	Provision *store.StateChange
	// Authority says on what authority the provision runs, for the
	// audit.
	Authority string
	// Report is the verified network report.
	Report netreport.Report
}

// Decide applies the rules to r. It returns a *Refusal for an installation
// it refuses (also when the inventory cannot answer: Refusal.Err then
// wraps lifecycle.ErrSourceUnavailable), and other errors for store
// failures, on which nothing is decided.
func (a *Admitter) Decide(ctx context.Context, r Request) (Decision, error) {
	name := r.Device
	refuse := func(rule Rule, field, do, format string, args ...any) *Refusal {
		return &Refusal{Rule: rule, Field: field, Device: name, Reason: fmt.Sprintf(format, args...), Do: do}
	}

	d, err := a.Source.Get(ctx, name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return Decision{}, refuse(RuleDeclared, "", "this machine is not declared: add it to the inventory and apply it, then run the intake again",
			"no declaration named %q in %s", name, a.Source.Name())
	case err != nil:
		rf := refuse(RuleInventory, "", "the inventory cannot answer now; nothing was changed: try again later",
			"the inventory source %s cannot answer: %v", a.Source.Name(), err)
		rf.Err = fmt.Errorf("%w: %w", lifecycle.ErrSourceUnavailable, err)
		return Decision{}, rf
	}

	if f := Missing(d); f != "" {
		return Decision{}, refuse(RuleComplete, f, "the declaration of this machine lacks "+f+": complete it in the inventory and apply it",
			"the declaration lacks %s", f)
	}

	auth, err := a.Source.Binding(ctx, d)
	if err != nil {
		rf := refuse(RuleInventory, "", "the inventory cannot answer now; nothing was changed: try again later",
			"the inventory source %s cannot say who wrote the EK binding: %v", a.Source.Name(), err)
		rf.Err = fmt.Errorf("%w: %w", lifecycle.ErrSourceUnavailable, err)
		return Decision{}, rf
	}
	if !auth.Honoured {
		return Decision{}, refuse(RuleBinding, inventory.FieldEKPins, "this machine's EK binding is not honoured: a declarer applies it",
			"%s", auth.Why)
	}
	if !slices.Contains(d.EKPins, r.EKPin) {
		return Decision{}, refuse(RuleBinding, inventory.FieldEKPins, "the TPM of this intake is not the one declared for this machine",
			"the intake session proved EK %.80q, which the binding does not name", r.EKPin)
	}

	state := store.StatePlanned
	n, err := a.Nodes.GetNode(ctx, name)
	switch {
	case err == nil:
		state = n.State
	case !errors.Is(err, store.ErrNotFound):
		return Decision{}, fmt.Errorf("look up node %s: %w", name, err)
	}
	if state != store.StatePlanned && state != store.StateProvisioning {
		return Decision{}, refuse(RuleState, "", "this machine is "+state+", not planned or provisioning: it is installed only once (retire it and declare it anew to reinstall)",
			"the node is %s", state)
	}

	rep, rf := a.checkReport(r, d)
	if rf != nil {
		rf.Device = name
		return Decision{}, rf
	}

	out := Decision{Decl: d, From: state, Report: rep}
	isCP := a.controlPlane(d)
	if state == store.StateProvisioning {
		hist, err := a.Nodes.NodeHistory(ctx, name)
		if err != nil {
			return Decision{}, fmt.Errorf("read the history of node %s: %w", name, err)
		}
		var last *store.StateChange
		for i := range hist {
			if hist[i].To == store.StateProvisioning {
				last = &hist[i]
			}
		}
		if isCP && (last == nil || last.Actor == AutoActor) {
			return Decision{}, refuse(RuleControlPlane, "", "this machine is a control plane: it installs only after the owner runs fleetd nodes provision "+name,
				"the control plane's provision was not started by an admin (%s)", provisionedBy(last))
		}
		out.Authority = "unfinished provision started by " + provisionedBy(last)
		return out, nil
	}

	// Planned: nothing returns a node to planned, so this is its first
	// install.
	switch {
	case isCP:
		return Decision{}, refuse(RuleControlPlane, "", "this machine is a control plane: it installs only after the owner runs fleetd nodes provision "+name,
			"a planned control plane is never provisioned automatically")
	case !a.AutoProvision:
		return Decision{}, refuse(RuleProvision, "", "this machine is planned and not provisioned: the owner runs fleetd nodes provision "+name,
			"the device is planned, auto-provision is off and no provision was started")
	case d.Class != lifecycle.ClassWorker:
		return Decision{}, refuse(RuleProvision, "", "this machine is planned and not provisioned: the owner runs fleetd nodes provision "+name,
			"auto-provision starts only a worker's first install, and the device is of class %s", d.Class)
	}
	out.Provision = &store.StateChange{Time: r.Now, NodeID: name, From: store.StatePlanned, To: store.StateProvisioning,
		Actor: AutoActor, Reason: "auto-provision of a worker's first installation"}
	out.Authority = "auto-provision of a worker's first installation"
	return out, nil
}

func provisionedBy(c *store.StateChange) string {
	if c == nil {
		return "no recorded actor"
	}
	return c.Actor + " at " + c.Time.UTC().Format(time.RFC3339)
}

// checkReport verifies the report's signature, its age and its port.
func (a *Admitter) checkReport(r Request, d store.Declaration) (netreport.Report, *Refusal) {
	refuse := func(rule Rule, field, do, format string, args ...any) *Refusal {
		return &Refusal{Rule: rule, Field: field, Reason: fmt.Sprintf(format, args...), Do: do}
	}
	if r.Report == nil {
		return netreport.Report{}, refuse(RuleReportMissing, "", "a network report is required (bcd reads it from lldpctl -f json or a file): is lldpd running on the machine?",
			"no network report came with the request: a certificate alone never authorizes installation")
	}
	if err := r.Report.Verify(r.DeviceKey); err != nil {
		return netreport.Report{}, refuse(RuleReportSignature, "", "the network report is not signed by this machine's device key: run the intake again",
			"%v", err)
	}
	rep := r.Report.Report
	maxAge, skew := a.MaxReportAge, a.MaxSkew
	if maxAge <= 0 {
		maxAge = DefaultMaxReportAge
	}
	if skew <= 0 {
		skew = DefaultMaxSkew
	}
	if age := r.Now.Sub(rep.ObservedAt); age > maxAge {
		return rep, refuse(RuleReportAge, "observed_at", fmt.Sprintf("the network report is older than %s: send a fresh one", maxAge),
			"the report was observed at %s, %s before now, more than %s", rep.ObservedAt.UTC().Format(time.RFC3339), age.Round(time.Second), maxAge)
	}
	if ahead := rep.ObservedAt.Sub(r.Now); ahead > skew {
		return rep, refuse(RuleReportFuture, "observed_at", "the network report is dated in the future: check the machine's clock",
			"the report is dated %s, %s after now, more than the %s allowed", rep.ObservedAt.UTC().Format(time.RFC3339), ahead.Round(time.Second), skew)
	}
	if !ChassisMatches(d.SwitchChassis, rep) {
		return rep, refuse(RulePort, inventory.FieldSwitchChassis, "the machine reports another switch than declared: check its cable, or the inventory's expected_port",
			"declared chassis %q; the report names chassis id %q (%s), name %q", d.SwitchChassis, rep.ChassisID, rep.ChassisIDType, rep.ChassisName)
	}
	if !PortMatches(d.SwitchPort, rep) {
		return rep, refuse(RulePort, inventory.FieldSwitchPort, "the machine reports another switch port than declared: check its cable, or the inventory's expected_port",
			"declared port %q on %q; the report names port id %q (%s), description %q", d.SwitchPort, d.SwitchChassis, rep.PortID, rep.PortIDType, rep.PortDescr)
	}
	return rep, nil
}
