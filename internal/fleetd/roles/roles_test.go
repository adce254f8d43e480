package roles

import (
	"strings"
	"testing"
)

func TestEachRoleMayDoWhatTheTableSaysAndNothingElse(t *testing.T) {
	want := map[Role][]Action{
		Owner:    Actions(),
		Declarer: {ReadInventory, WriteInventory},
		Operator: {ReadFleet, ReadInventory, Lifecycle, CreateToken, ReadExport, ApplyExport},
		Auditor:  {ReadFleet, ReadInventory, ReadAdmins, ReadExport},
	}
	for _, r := range All {
		for _, a := range Actions() {
			allowed := false
			for _, w := range want[r] {
				allowed = allowed || w == a
			}
			if r.May(a) != allowed {
				t.Errorf("%s may %q: %t, want %t", r, a, r.May(a), allowed)
			}
		}
	}
}

func TestRefusalNamesTheRolesNeeded(t *testing.T) {
	msg := Refusal("alice", Declarer, CreateToken)
	for _, s := range []string{"alice", "role declarer", "create join tokens", "needs role owner or operator"} {
		if !strings.Contains(msg, s) {
			t.Errorf("%q does not say %q", msg, s)
		}
	}
	if got := Refusal("bob", Operator, Retire); !strings.HasSuffix(got, "needs role owner") {
		t.Errorf("retire refusal: %q", got)
	}
}

func TestParse(t *testing.T) {
	for _, r := range All {
		if got, err := Parse(string(r)); err != nil || got != r {
			t.Errorf("Parse(%s) = %s, %v", r, got, err)
		}
	}
	if _, err := Parse("root"); err == nil || !strings.Contains(err.Error(), "owner, declarer, operator or auditor") {
		t.Errorf("Parse(root): %v", err)
	}
}
