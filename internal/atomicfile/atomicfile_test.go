package atomicfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// entries returns the names in dir, to check that no temporary file is left.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFile(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)

	tests := []struct {
		name     string
		existing []byte // nil: no file before
		oldPerm  os.FileMode
		data     []byte
		perm     os.FileMode
	}{
		{name: "new file", data: []byte("hello"), perm: 0o600},
		{name: "perm beyond umask", data: []byte("hello"), perm: 0o644},
		{name: "empty content", data: []byte{}, perm: 0o600},
		{name: "replace", existing: []byte("old content that is longer"), oldPerm: 0o644, data: []byte("new"), perm: 0o600},
		{name: "replace widens perm", existing: []byte("old"), oldPerm: 0o600, data: []byte("new"), perm: 0o640},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f.json")
			if tt.existing != nil {
				if err := os.WriteFile(path, tt.existing, tt.oldPerm); err != nil {
					t.Fatal(err)
				}
			}
			if err := WriteFile(path, tt.data, tt.perm); err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.data) {
				t.Errorf("content = %q, want %q", got, tt.data)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tt.perm {
				t.Errorf("mode = %v, want %v", fi.Mode().Perm(), tt.perm)
			}
			if names := entries(t, dir); len(names) != 1 || names[0] != "f.json" {
				t.Errorf("directory holds %v, want only f.json", names)
			}
		})
	}
}

func TestWriteFileReplacesSymlinkNotTarget(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("target"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(link, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(target); string(got) != "target" {
		t.Errorf("link target changed to %q", got)
	}
	fi, err := os.Lstat(link)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() {
		t.Errorf("link is %v after WriteFile, want a regular file", fi.Mode())
	}
}

func TestWriteFileFailures(t *testing.T) {
	t.Run("missing directory", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "nope", "f")
		err := WriteFile(path, []byte("x"), 0o600)
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err = %v, want one wrapping os.ErrNotExist", err)
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name %s", err, path)
		}
	})
	t.Run("rename over a directory keeps it and leaves no temp file", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "d")
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path, "inner"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := WriteFile(path, []byte("x"), 0o600); err == nil {
			t.Fatal("WriteFile over a non-empty directory succeeded")
		}
		if names := entries(t, dir); len(names) != 1 || names[0] != "d" {
			t.Errorf("directory holds %v, want only d", names)
		}
	})
}

func TestRenameAndRemove(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(a, []byte("A"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte("B"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(b); string(got) != "A" {
		t.Errorf("b = %q after Rename, want A", got)
	}
	if _, err := os.Lstat(a); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a still exists after Rename: %v", err)
	}
	if err := Rename(a, b); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Rename of a missing file: err = %v, want os.ErrNotExist", err)
	}
	if err := Remove(b); err != nil {
		t.Fatal(err)
	}
	if err := Remove(b); err != nil {
		t.Errorf("Remove of a missing file: %v, want nil", err)
	}
	if names := entries(t, dir); len(names) != 0 {
		t.Errorf("directory holds %v, want nothing", names)
	}
}
