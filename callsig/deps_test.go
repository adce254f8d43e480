package callsig

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps callsig a small public library: it imports the standard
// library and nodetrust's pki package, nothing else, and never log or
// log/slog (libraries return errors; they do not log).
func TestImports(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	out, err := exec.Command(gobin, "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(p, "/")
		switch {
		case p == "github.com/nodetrust/nodetrust/pki":
		case p == "log" || strings.HasPrefix(p, "log/"):
			t.Errorf("callsig imports %s: a library does not log", p)
		case strings.Contains(first, "."):
			t.Errorf("callsig imports %s: only the standard library and pki are allowed", p)
		}
	}
}
