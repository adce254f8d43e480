package attest_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps the verifier a library of pure checks: it must not
// reach, even indirectly, storage, HTTP serving, logging, or the node's TPM
// client (the verifier works from bytes; package tpm opens devices). Its
// only nodetrust dependency is tpm/tpmpub, the shared public-area parser.
func TestDependencies(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/nodetrust/nodetrust/"
	for _, p := range strings.Fields(string(out)) {
		switch {
		case p == "database/sql" || strings.HasPrefix(p, "database/sql/"),
			p == "net/http" || strings.HasPrefix(p, "net/http/"),
			p == "log" || strings.HasPrefix(p, "log/"):
			t.Errorf("attest depends on %s", p)
		case strings.HasPrefix(p, module):
			switch strings.TrimPrefix(p, module) {
			case "attest", "tpm/tpmpub":
			default:
				t.Errorf("attest depends on %s; only tpm/tpmpub is allowed", p)
			}
		}
	}
}
