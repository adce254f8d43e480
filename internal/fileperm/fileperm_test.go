package fileperm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckDir(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		// Chmod: the umask does not apply to it.
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := []struct {
		name string
		path string
	}{
		{"a private folder is fine", mk("private", 0o700)},
		{"a folder others may read but not write is fine", mk("readable", 0o755)},
		{"a folder that does not exist yet is fine", filepath.Join(base, "absent")},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckDir(tc.path, "the data directory", 0o700); err != nil {
				t.Errorf("CheckDir: %v", err)
			}
		})
	}

	t.Run("a folder others may write is refused with the chmod to run", func(t *testing.T) {
		p := mk("open", 0o777)
		err := CheckDir(p, "the data directory", 0o700)
		var pr *Problem
		if !errors.As(err, &pr) || !errors.Is(err, ErrUnsafe) {
			t.Fatalf("CheckDir = %v, want a *Problem wrapping ErrUnsafe", err)
		}
		if pr.Fix != "chmod 0700 "+p || !strings.Contains(err.Error(), "writable by others (mode 0777)") {
			t.Errorf("problem %+v; message %q", pr, err)
		}
	})
	t.Run("a sticky folder others may write is refused too", func(t *testing.T) {
		p := mk("sticky", 0o777|os.ModeSticky)
		if err := CheckDir(p, "the data directory", 0o700); !errors.Is(err, ErrUnsafe) {
			t.Errorf("CheckDir = %v, want ErrUnsafe", err)
		}
	})
	t.Run("a file where a folder belongs is refused", func(t *testing.T) {
		p := filepath.Join(base, "file")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := CheckDir(p, "the data directory", 0o700); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "is not a folder") {
			t.Errorf("CheckDir = %v", err)
		}
	})
	t.Run("a folder another user owns is refused with the chown to run", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("only root can give a folder to another user")
		}
		p := mk("foreign", 0o700)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		err := CheckDir(p, "the data directory", 0o700)
		var pr *Problem
		if !errors.As(err, &pr) || pr.Fix != "chown root "+p {
			t.Fatalf("CheckDir = %v, want the chown to root", err)
		}
		// The owner named as allowed (the [helper] user) may own it.
		if err := CheckDir(p, "the data directory", 0o700, 65534); err != nil {
			t.Errorf("CheckDir with the owner allowed: %v", err)
		}
	})
}

func TestOthersCanRead(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		mode os.FileMode
		want bool
	}{{0o600, false}, {0o640, false}, {0o644, true}, {0o604, true}} {
		p := filepath.Join(dir, tc.mode.String())
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tc.mode); err != nil {
			t.Fatal(err)
		}
		got, mode, err := OthersCanRead(p)
		if err != nil || got != tc.want || mode != tc.mode {
			t.Errorf("OthersCanRead(%04o) = %v, %04o, %v; want %v", tc.mode, got, mode, err, tc.want)
		}
	}
	if _, _, err := OthersCanRead(filepath.Join(dir, "absent")); !os.IsNotExist(err) {
		t.Errorf("an absent file: %v", err)
	}
}
