package roles

import (
	"fmt"
	"slices"
	"strings"
)

// Role is an admin credential's role, carried in its certificate.
type Role string

// The roles.
const (
	Owner    Role = "owner"
	Declarer Role = "declarer"
	Operator Role = "operator"
	Auditor  Role = "auditor"
)

// All lists the roles in the order documentation shows them.
var All = []Role{Owner, Declarer, Operator, Auditor}

// Parse returns the role named s; an unknown name is an error listing the
// roles.
func Parse(s string) (Role, error) {
	r := Role(s)
	if !slices.Contains(All, r) {
		return "", fmt.Errorf("role %q is not one of %s", s, names(All))
	}
	return r, nil
}

// Action is what an admin call does, as the refusal names it.
type Action string

// The actions admin calls are checked against.
const (
	ReadFleet      Action = "read the fleet (nodes, tokens, pending joins, claims, history, audit)"
	ReadInventory  Action = "read the inventory and its changelog"
	WriteInventory Action = "write the inventory and EK bindings"
	Lifecycle      Action = "change a node's lifecycle (provision, quarantine, revoke, approve, check boot)"
	Release        Action = "lift a quarantine (release)"
	Retire         Action = "retire or delete a node"
	CreateToken    Action = "create join tokens"
	ReadAdmins     Action = "list admin credentials"
	ManageAdmins   Action = "create and revoke admin credentials"
)

// table says which roles may do each action; the owner may do everything.
var table = map[Action][]Role{
	ReadFleet:      {Owner, Operator, Auditor},
	ReadInventory:  {Owner, Declarer, Operator, Auditor},
	WriteInventory: {Owner, Declarer},
	Lifecycle:      {Owner, Operator},
	Retire:         {Owner},
	Release:        {Owner},
	CreateToken:    {Owner, Operator},
	ReadAdmins:     {Owner, Auditor},
	ManageAdmins:   {Owner},
}

// Actions lists every action, for tables and tests.
func Actions() []Action {
	out := make([]Action, 0, len(table))
	for a := range table {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// May reports whether role r may do a.
func (r Role) May(a Action) bool { return slices.Contains(table[a], r) }

// Needed lists the roles that may do a.
func Needed(a Action) []Role { return slices.Clone(table[a]) }

// Refusal is the message for an admin named name with role r that may not
// do a: it names the roles that may.
func Refusal(name string, r Role, a Action) string {
	return fmt.Sprintf("admin %s has role %s; to %s it needs role %s", name, r, a, names(table[a]))
}

func names(rs []Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	if len(s) <= 1 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}
