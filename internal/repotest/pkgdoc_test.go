package repotest

import (
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
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, path, func(fi fs.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		for pkgName, pkg := range pkgs {
			checked++
			var docs []string
			for fname, f := range pkg.Files {
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
				f := pkg.Files[docs[0]]
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
