package repotest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// securityDoc is the threat model whose evidence this test checks.
const securityDoc = "../../docs/security.md"

// namedTestRE finds a test or fuzz target named in a cell: `TestX`, or
// `TestX/sub test` (the top-level function is what must exist).
var namedTestRE = regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)(?:/[^`]*)?`")

// threatRow is one row of a threat table: its threat, status and the
// tests its evidence names.
type threatRow struct {
	line   int
	threat string
	status string
	tests  []string
}

// threatRows reads the rows of every threat table in doc (tables whose
// header starts "| Threat | Status |").
func threatRows(t *testing.T, doc string) []threatRow {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatalf("read the threat model: %v", err)
	}
	var rows []threatRow
	inTable := false
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "| Threat | Status |"):
			inTable = true
			continue
		case !strings.HasPrefix(line, "|"):
			inTable = false
			continue
		case !inTable || strings.HasPrefix(line, "| ---"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 4 {
			t.Errorf("%s:%d: a threat row needs 4 cells (threat, status, control and evidence, boundary), it has %d", doc, i+1, len(cells))
			continue
		}
		r := threatRow{line: i + 1, threat: strings.TrimSpace(cells[0]), status: strings.TrimSpace(cells[1])}
		for _, m := range namedTestRE.FindAllStringSubmatch(cells[2], -1) {
			r.tests = append(r.tests, m[1])
		}
		rows = append(rows, r)
	}
	return rows
}

// definedTests returns the test and fuzz functions defined in the
// module's _test.go files.
func definedTests(t *testing.T) map[string]bool {
	t.Helper()
	defRE := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]+)\(`)
	out := map[string]bool{}
	err := filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != "../.." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range defRE.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEverySolvedThreatNamesATestThatExists checks docs/security.md: every
// row is "Solved" or "Not solved", every "Solved" row names at least one
// test, and every test any row names is defined in the module.
func TestEverySolvedThreatNamesATestThatExists(t *testing.T) {
	rows := threatRows(t, securityDoc)
	if len(rows) < 10 {
		t.Fatalf("%s has %d threat rows: the tables were not found", securityDoc, len(rows))
	}
	defined := definedTests(t)
	for _, r := range rows {
		switch r.status {
		case "Solved":
			if len(r.tests) == 0 {
				t.Errorf("%s:%d: %q is Solved but names no test", securityDoc, r.line, r.threat)
			}
		case "Not solved":
		default:
			t.Errorf("%s:%d: %q has status %q, want Solved or Not solved", securityDoc, r.line, r.threat, r.status)
		}
		for _, name := range r.tests {
			if !defined[name] {
				t.Errorf("%s:%d: %q names %s, which no _test.go file defines", securityDoc, r.line, r.threat, name)
			}
		}
	}
}

// TestThreatRowParsing checks the parser on a table with a missing test,
// so the check above cannot pass by reading nothing.
func TestThreatRowParsing(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "security.md")
	text := "# x\n\n| Threat | Status | Control and evidence | Remaining boundary |\n| --- | --- | --- | --- |\n" +
		"| A | Solved | Something. `TestA`, `TestB/with a subtest`. | — |\n| B | Not solved | Nothing. | All. |\n\nafter\n| not | a | threat | row |\n"
	if err := os.WriteFile(doc, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	rows := threatRows(t, doc)
	if len(rows) != 2 || rows[0].status != "Solved" || strings.Join(rows[0].tests, ",") != "TestA,TestB" || rows[1].status != "Not solved" || len(rows[1].tests) != 0 {
		t.Fatalf("rows %+v, want A (Solved; TestA, TestB) and B (Not solved)", rows)
	}
}
