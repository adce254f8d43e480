package service

import (
	"testing"

	"github.com/nodetrust/nodetrust/api/adminv1"
)

// Every Admin method is checked against a role: one missing from
// adminActions would be refused to everyone.
func TestEveryAdminMethodHasARule(t *testing.T) {
	for _, m := range adminv1.Admin_ServiceDesc.Methods {
		if _, ok := adminActions[m.MethodName]; !ok {
			t.Errorf("Admin method %s has no entry in adminActions", m.MethodName)
		}
	}
	if len(adminActions) != len(adminv1.Admin_ServiceDesc.Methods) {
		t.Errorf("adminActions has %d entries for %d methods", len(adminActions), len(adminv1.Admin_ServiceDesc.Methods))
	}
}
