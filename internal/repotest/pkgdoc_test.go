package repotest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryPackageHasADocComment walks the module and checks that each
// package (generated code and testdata aside) has exactly one package doc
// comment, and that it starts with "Package <name>" (or "Command <name>"
// for a main package).
func TestEveryPackageHasADocComment(t *testing.T) {
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "api") {
			return filepath.SkipDir
		}
		pkgs, err := parsePackages(path)
		if err != nil {
			return err
		}
		for pkgName, pkg := range pkgs {
			checked++
			var docs []string
			for fname, f := range pkg {
				if f.Doc != nil {
					docs = append(docs, fname)
				}
			}
			rel, _ := filepath.Rel(root, path)
			switch {
			case len(docs) == 0:
				t.Errorf("package %s (%s) has no doc comment: add one, in doc.go", pkgName, rel)
			case len(docs) > 1:
				t.Errorf("package %s (%s) has doc comments in %d files (%s): keep one", pkgName, rel, len(docs), strings.Join(docs, ", "))
			default:
				f := pkg[docs[0]]
				text := f.Doc.Text()
				want := "Package " + pkgName
				if pkgName == "main" {
					want = "Command "
				}
				if !strings.HasPrefix(text, want) {
					t.Errorf("package %s (%s): the doc comment starts %q, want %q", pkgName, rel, firstLine(text), want)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Fatalf("checked only %d packages: is the walk rooted at the module?", checked)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the walk is not rooted at the module: %v", err)
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// parsePackages parses the package clauses and doc comments of the
// non-test Go files in dir, grouped by package name.
func parsePackages(dir string) (map[string]map[string]*ast.File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	pkgs := map[string]map[string]*ast.File{}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return nil, err
		}
		if pkgs[f.Name.Name] == nil {
			pkgs[f.Name.Name] = map[string]*ast.File{}
		}
		pkgs[f.Name.Name][n] = f
	}
	return pkgs, nil
}
