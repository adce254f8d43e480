package identity

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/internal/atomicfile"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
)

// Persist stores a newly joined identity in dir (join step 6), creating dir
// with mode 0700 if it is missing:
//
//  1. If dir holds another node's identity.json, dir/journal.db (with its
//     SQLite sidecar files) is moved aside as journal.db.<old node>-<unix time
//     of now>; an identity.json too corrupt to name its node counts as
//     another node's, named "unknown".
//  2. A stale node.key.next is removed.
//  3. node.key is written, then identity.json, each with mode 0600 and
//     atomically.
//
// id must name its node and hold a parseable leaf; keyPEM is stored as is.
func Persist(dir string, id Identity, keyPEM []byte, now time.Time) error {
	if err := validate(id, keyPEM); err != nil {
		return fmt.Errorf("persist identity: %w", err)
	}
	data, err := marshal(id)
	if err != nil {
		return fmt.Errorf("persist identity: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("persist identity: %w", err)
	}

	idPath := datadir.Layout(dir).Identity()
	old, err := os.ReadFile(idPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("persist identity: read the previous identity: %w", err)
	default:
		var prev struct {
			NodeID string `json:"node_id"`
		}
		oldNode := "unknown"
		if json.Unmarshal(old, &prev) == nil && prev.NodeID != "" {
			oldNode = prev.NodeID
		}
		if prev.NodeID != id.NodeID {
			if err := moveJournalAside(dir, oldNode, now); err != nil {
				return fmt.Errorf("persist identity: %w", err)
			}
		}
	}

	if err := atomicfile.Remove(datadir.Layout(dir).NextKey()); err != nil {
		return fmt.Errorf("persist identity: remove the stale next node key: %w", err)
	}
	if err := atomicfile.WriteFile(datadir.Layout(dir).Key(), keyPEM, 0o600); err != nil {
		return fmt.Errorf("persist identity: %w", err)
	}
	if err := atomicfile.WriteFile(idPath, data, 0o600); err != nil {
		return fmt.Errorf("persist identity: %w", err)
	}
	return nil
}

// moveJournalAside renames journal.db and its sidecars, those that exist, to
// journal.db.<oldNode>-<unix time>.
func moveJournalAside(dir, oldNode string, now time.Time) error {
	names := existing(dir, datadir.JournalFiles())
	tag := freeTag(dir, names, "."+safeName(oldNode)+"-"+strconv.FormatInt(now.Unix(), 10))
	for _, name := range names {
		to := filepath.Join(dir, asideName(name, tag))
		if err := atomicfile.Rename(filepath.Join(dir, name), to); err != nil {
			return fmt.Errorf("move the previous node's journal aside: %w", err)
		}
	}
	return nil
}

// WriteNextKey stores a renewal's next key as node.key.next (mode 0600,
// atomically), before the renewal request is sent (renewal step 2).
func WriteNextKey(dir string, keyPEM []byte) error {
	if len(keyPEM) == 0 {
		return errors.New("write the next node key: the key is empty")
	}
	if err := atomicfile.WriteFile(datadir.Layout(dir).NextKey(), keyPEM, 0o600); err != nil {
		return fmt.Errorf("write the next node key: %w", err)
	}
	return nil
}

// The steps of StoreRenewal, as passed to its hook.
const (
	StepNextKey  = "next-key" // node.key.next is written
	StepIdentity = "identity" // identity.json holds the new certificate
	StepPromote  = "promote"  // node.key.next is renamed over node.key
)

// StoreRenewal stores a renewed identity whose leaf certifies keyPEM's key
// (renewal step 5), in the order that leaves a key and a certificate that
// match, as LoadState reads them, after a crash at any point:
//
//  1. node.key.next is written again, in case something removed it; then
//     hook(StepNextKey).
//  2. identity.json is written; then hook(StepIdentity).
//  3. node.key.next is renamed over node.key and dir is synced; then
//     hook(StepPromote).
//
// Each write is atomic with mode 0600. The caller has checked the answer: the
// new leaf names the same node, site, trust domain and role and certifies the
// new key. hook may be nil; tests use it to stop the process after a step.
func StoreRenewal(dir string, id Identity, keyPEM []byte, hook func(step string)) error {
	if err := validate(id, keyPEM); err != nil {
		return fmt.Errorf("store renewal: %w", err)
	}
	data, err := marshal(id)
	if err != nil {
		return fmt.Errorf("store renewal: %w", err)
	}
	if hook == nil {
		hook = func(string) {}
	}
	if err := WriteNextKey(dir, keyPEM); err != nil {
		return fmt.Errorf("store renewal: %w", err)
	}
	hook(StepNextKey)
	if err := atomicfile.WriteFile(datadir.Layout(dir).Identity(), data, 0o600); err != nil {
		return fmt.Errorf("store renewal: %w", err)
	}
	hook(StepIdentity)
	if err := atomicfile.Rename(datadir.Layout(dir).NextKey(), datadir.Layout(dir).Key()); err != nil {
		return fmt.Errorf("store renewal: promote the next node key: %w", err)
	}
	hook(StepPromote)
	return nil
}

// resetFiles are the files bcd join --reset moves aside, in the order it
// moves them: identity.json first, so an interrupted reset leaves a node that
// has not joined rather than a half identity.
func resetFiles() []string {
	return append([]string{datadir.IdentityFile, datadir.KeyFile, datadir.NextKeyFile}, datadir.JournalFiles()...)
}

// ResetPlan returns the full paths of the files in dir that MoveAside would
// move: those that exist of identity.json, node.key, node.key.next and
// journal.db with its SQLite sidecars (journal.db-wal, -shm, -journal). It
// changes nothing.
func ResetPlan(dir string) []string {
	var paths []string
	for _, name := range existing(dir, resetFiles()) {
		paths = append(paths, filepath.Join(dir, name))
	}
	return paths
}

// MoveAside moves the files of ResetPlan aside, each renamed to
// <name>.reset-<unix time of now> (a journal sidecar to
// journal.db.reset-<time>-wal and so on, beside its journal), and returns
// their new paths. If a name is taken, a counter is added (.reset-<time>.1).
// On an error it returns the paths moved so far.
func MoveAside(dir string, now time.Time) ([]string, error) {
	names := existing(dir, resetFiles())
	tag := freeTag(dir, names, ".reset-"+strconv.FormatInt(now.Unix(), 10))
	var moved []string
	for _, name := range names {
		to := filepath.Join(dir, asideName(name, tag))
		if err := atomicfile.Rename(filepath.Join(dir, name), to); err != nil {
			return moved, fmt.Errorf("move %s aside: %w", name, err)
		}
		moved = append(moved, to)
	}
	return moved, nil
}

// existing returns the names that exist in dir, in order.
func existing(dir string, names []string) []string {
	var out []string
	for _, name := range names {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			out = append(out, name)
		}
	}
	return out
}

// asideName is name with tag: after the name, or for a journal sidecar
// between journal.db and the sidecar's suffix, so SQLite still pairs them.
func asideName(name, tag string) string {
	if rest, ok := strings.CutPrefix(name, datadir.JournalFile); ok && rest != "" {
		return datadir.JournalFile + tag + rest
	}
	return name + tag
}

// freeTag returns tag, or tag.N for the smallest N ≥ 1, such that no name
// with it exists in dir.
func freeTag(dir string, names []string, tag string) string {
	try := tag
	for n := 1; ; n++ {
		free := true
		for _, name := range names {
			if _, err := os.Lstat(filepath.Join(dir, asideName(name, try))); err == nil {
				free = false
				break
			}
		}
		if free {
			return try
		}
		try = tag + "." + strconv.Itoa(n)
	}
}

// safeName makes a node id safe as part of a file name.
func safeName(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
	if len(s) > 128 {
		s = s[:128]
	}
	if s == "" || strings.Trim(s, ".") == "" {
		return "unknown"
	}
	return s
}
