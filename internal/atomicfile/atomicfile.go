package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces the file at path with data and gives it mode perm,
// whatever the umask. It writes a temporary file in path's directory, syncs
// it, sets perm, renames it over path and syncs the directory. When it returns
// nil the new content is durable; when it fails, path holds its old content
// (or still does not exist) and the temporary file is removed.
//
// A symbolic link at path is replaced by a regular file; the link's target is
// not touched.
func WriteFile(path string, data []byte, perm os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err = f.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = SyncDir(dir); err != nil {
		// The rename happened: the temporary file no longer exists, and the
		// new content is in place even though its durability is unknown.
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Rename renames oldpath to newpath, replacing newpath, and syncs the
// directories involved so the rename survives a crash once Rename returns nil.
func Rename(oldpath, newpath string) error {
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	newDir := filepath.Dir(newpath)
	if err := SyncDir(newDir); err != nil {
		return fmt.Errorf("rename %s to %s: %w", oldpath, newpath, err)
	}
	if oldDir := filepath.Dir(oldpath); oldDir != newDir {
		if err := SyncDir(oldDir); err != nil {
			return fmt.Errorf("rename %s to %s: %w", oldpath, newpath, err)
		}
	}
	return nil
}

// Remove removes the file at path and syncs its directory. A file that does
// not exist is not an error.
func Remove(path string) error {
	if err := os.Remove(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir syncs the directory dir, making the creations, renames and removals
// of its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
