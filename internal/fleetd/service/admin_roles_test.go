package service

import (
	"testing"

	"github.com/nodetrust/nodetrust/api/adminv1"
)

// Every Admin method and export endpoint is checked against a role: one
// missing from adminActions would be refused to everyone, and an entry for
// no call is stale.
func TestEveryAdminMethodHasARule(t *testing.T) {
	var names []string
	for _, m := range adminv1.Admin_ServiceDesc.Methods {
		names = append(names, m.MethodName)
	}
	for _, m := range adminv1.Admin_ServiceDesc.Streams {
		names = append(names, m.StreamName)
	}
	// The export endpoints of the HTTPS listener are admitted as Admin
	// calls of these names (adminHTTP).
	names = append(names, "ExportRegistrations", "ExportHolds", "ExportAllowed", "ExportAllow", "ExportRun")
	for _, name := range names {
		if _, ok := adminActions[name]; !ok {
			t.Errorf("Admin method %s has no entry in adminActions", name)
		}
	}
	if len(adminActions) != len(names) {
		t.Errorf("adminActions has %d entries for %d methods", len(adminActions), len(names))
	}
}
