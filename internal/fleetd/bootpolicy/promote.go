package bootpolicy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nodetrust/nodetrust/internal/atomicfile"
)

// BackupSuffix names the copy [Promote] keeps of the file it rewrites:
// not a *.toml file, so [Load] does not read it.
const BackupSuffix = ".before-promote"

// Promotion is what [Promote] did.
type Promotion struct {
	File, Backup string
	// Window is the next state's window; Early or Late say the promotion
	// came before it opened or after it ended.
	Window      Window
	Early, Late bool
	// Description is the next state's.
	Description string
}

// Promote rewrites the policy file at path so that its [next] state
// becomes the current one and the old current state is gone: each rule
// [next] gives replaces the current one, the others stay, and [next] is
// removed. The file is regenerated: its comments are NOT kept (a header
// says so); the previous file is kept beside it as path+[BackupSuffix].
// The new file is checked as [Load] checks it before it replaces the old
// one, atomically (a temporary file in the same directory, synced, then
// renamed). A running server reads policies at start: restart it.
func Promote(path string, now time.Time) (*Promotion, error) {
	raw, err := readBounded(path, maxPolicyFileSize)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if _, err := parsePolicy(dir, path, raw); err != nil {
		return nil, fmt.Errorf("%w: fix the file before promoting: %w", ErrPolicy, err)
	}
	f, md, err := decodePolicy(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Next == nil {
		return nil, fmt.Errorf("%s: %w", path, errNoNext)
	}
	n := f.Next
	pr := &Promotion{File: path, Backup: path + BackupSuffix, Window: Window{NotBefore: n.NotBefore, NotAfter: n.NotAfter}, Description: n.Description}
	pr.Early, pr.Late = now.Before(n.NotBefore), !now.Before(n.NotAfter)
	for _, k := range stateKeys {
		if md.IsDefined("next", k) {
			setStateKey(&f.stateFile, &n.stateFile, k)
		}
	}
	f.Next = nil
	what := "the [next] state"
	if n.Description != "" {
		what += " (" + n.Description + ")"
	}
	header := []string{
		fmt.Sprintf("Rewritten by fleetd policy promote on %s: %s,", now.UTC().Format(time.RFC3339), what),
		fmt.Sprintf("window %s to %s, is now the current state.", n.NotBefore.UTC().Format(time.RFC3339), n.NotAfter.UTC().Format(time.RFC3339)),
		"The comments of the previous file are not kept; it is kept as " + filepath.Base(pr.Backup) + ".",
	}
	content := formatPolicy(header, f, nil, nil)
	if _, err := parsePolicy(dir, path, content); err != nil {
		return nil, fmt.Errorf("the promoted policy does not load (a bug; the file is unchanged): %w", err)
	}
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	if err := atomicfile.WriteFile(pr.Backup, raw, mode); err != nil {
		return nil, fmt.Errorf("keep the previous policy: %w", err)
	}
	if err := atomicfile.WriteFile(path, content, mode); err != nil {
		return nil, err
	}
	return pr, nil
}

// WriteNew writes a new policy file (a capture) atomically; it refuses to
// replace an existing file, even one made while it wrote: the complete file
// is linked into place, which fails if the name is taken.
func WriteNew(path string, b []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	name := tmp.Name()
	defer os.Remove(name) // the link keeps the file; the temporary name goes
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Link(name, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists: choose another --out, or remove it first", path)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return atomicfile.SyncDir(dir)
}
