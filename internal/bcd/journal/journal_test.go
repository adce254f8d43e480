package journal

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
)

// clock is a test clock that advances a second on every reading.
type clock struct{ t time.Time }

func newClock() *clock {
	return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *clock) now() time.Time {
	c.t = c.t.Add(time.Second)
	return c.t
}

// fixedClock always reads t.
func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

func open(t *testing.T, dir string, now func() time.Time) *Journal {
	t.Helper()
	j, err := Open(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func appendEntry(t *testing.T, j *Journal, kind, node, detail string) {
	t.Helper()
	if err := j.Append(context.Background(), kind, node, detail); err != nil {
		t.Fatal(err)
	}
}

func lastEntries(t *testing.T, j *Journal, n int) []Entry {
	t.Helper()
	es, err := j.Last(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// listDir returns the names in dir with their sizes and modification times,
// to show that nothing in it changed.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e.Name()+" "+strconv.FormatInt(fi.Size(), 10)+" "+fi.ModTime().String())
	}
	return out
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// writeIdentityFile puts a stand-in identity.json into dir and returns its
// content.
func writeIdentityFile(t *testing.T, dir string) []byte {
	t.Helper()
	data := []byte(`{"version":1,"node_id":"web-01"}` + "\n")
	if err := os.WriteFile(filepath.Join(dir, datadir.IdentityFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return data
}

func TestAppendLast(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	j := open(t, dir, c.now)
	if j.Recovered() {
		t.Error("a new journal reports Recovered")
	}
	if !validID(j.ID()) {
		t.Errorf("ID() = %q, want 32 hex digits", j.ID())
	}

	appendEntry(t, j, KindJoined, "web-01", "site lab, role worker")
	appendEntry(t, j, KindStarted, "web-01", "")
	appendEntry(t, j, KindRenewed, "web-01", "valid until 2026-03-02T12:00:00Z")

	got := lastEntries(t, j, 2)
	want := []Entry{
		{Seq: 3, Time: time.Date(2026, 3, 1, 12, 0, 3, 0, time.UTC), Kind: KindRenewed, NodeID: "web-01", Detail: "valid until 2026-03-02T12:00:00Z"},
		{Seq: 2, Time: time.Date(2026, 3, 1, 12, 0, 2, 0, time.UTC), Kind: KindStarted, NodeID: "web-01"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Last(2) = %+v, want %+v", got, want)
	}
	if got := lastEntries(t, j, 10); len(got) != 3 || got[2].Kind != KindJoined || got[2].Seq != 1 {
		t.Errorf("Last(10) = %+v, want the three entries, newest first", got)
	}
	if got := lastEntries(t, j, 0); got != nil {
		t.Errorf("Last(0) = %+v, want none", got)
	}
}

func TestAppendKeepsTimeZoneOut(t *testing.T) {
	loc := time.FixedZone("east", 5*3600)
	j := open(t, t.TempDir(), fixedClock(time.Date(2026, 3, 1, 17, 0, 0, 123456789, loc)))
	appendEntry(t, j, KindStarted, "web-01", "")
	got := lastEntries(t, j, 1)[0].Time
	if want := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC); !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("Time = %v, want %v in UTC", got, want)
	}
}

func TestAppendRefusesBadKind(t *testing.T) {
	j := open(t, t.TempDir(), nil)
	for _, kind := range []string{"", strings.Repeat("k", maxKind+1)} {
		if err := j.Append(context.Background(), kind, "web-01", ""); err == nil {
			t.Errorf("Append(kind %q) succeeded", kind)
		}
	}
	if got := lastEntries(t, j, 10); len(got) != 0 {
		t.Errorf("refused entries were stored: %+v", got)
	}
}

func TestDetailCapped(t *testing.T) {
	j := open(t, t.TempDir(), nil)
	long := strings.Repeat("é", MaxDetail) // 2 bytes each
	appendEntry(t, j, KindRenewalFailed, "web-01", long)
	appendEntry(t, j, KindRenewalFailed, "web-01", "bad \xff byte")
	appendEntry(t, j, KindRenewalFailed, "web-01", strings.Repeat("x", MaxDetail))

	es := lastEntries(t, j, 3)
	if d := es[0].Detail; d != strings.Repeat("x", MaxDetail) {
		t.Errorf("a detail of exactly MaxDetail bytes was changed to %d bytes", len(d))
	}
	if d := es[1].Detail; d != "bad \uFFFD byte" {
		t.Errorf("invalid UTF-8 stored as %q", d)
	}
	d := es[2].Detail
	if len(d) > MaxDetail || !utf8.ValidString(d) || !strings.HasSuffix(d, "…") || !strings.HasPrefix(long, strings.TrimSuffix(d, "…")) {
		t.Errorf("long detail stored as %d bytes (valid UTF-8 %v): %q…", len(d), utf8.ValidString(d), d[:20])
	}
}

func TestAppendOnly(t *testing.T) {
	j := open(t, t.TempDir(), nil)
	appendEntry(t, j, KindJoined, "web-01", "")
	ctx := context.Background()
	for _, stmt := range []string{
		`UPDATE entries SET kind = 'revoked'`,
		`DELETE FROM entries`,
		`UPDATE meta SET value = 'x'`,
		`DELETE FROM meta`,
	} {
		if _, err := j.db.ExecContext(ctx, stmt); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: err = %v, want the append-only refusal", stmt, err)
		}
	}
	if es := lastEntries(t, j, 10); len(es) != 1 || es[0].Kind != KindJoined {
		t.Errorf("entries after refused changes: %+v", es)
	}
}

func TestReopenKeepsIDAndEntries(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	j, err := Open(dir, c.now)
	if err != nil {
		t.Fatal(err)
	}
	id := j.ID()
	appendEntry(t, j, KindJoined, "web-01", "")
	appendEntry(t, j, KindStarted, "web-01", "")
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	j = open(t, dir, c.now)
	if j.ID() != id {
		t.Errorf("reopened ID() = %s, want %s", j.ID(), id)
	}
	if j.Recovered() {
		t.Error("a sound journal reports Recovered after reopening")
	}
	appendEntry(t, j, KindStarted, "web-01", "")
	es := lastEntries(t, j, 10)
	if len(es) != 3 || es[0].Seq != 3 || es[2].Kind != KindJoined {
		t.Errorf("entries after reopening: %+v", es)
	}
}

func TestWipedJournalStartsOver(t *testing.T) {
	dir := t.TempDir()
	idData := writeIdentityFile(t, dir)
	j, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := j.ID()
	appendEntry(t, j, KindJoined, "web-01", "")
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range journalNames() {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}

	j = open(t, dir, nil)
	if j.ID() == old || !validID(j.ID()) {
		t.Errorf("ID() after a wipe = %q, want a new id (old %s)", j.ID(), old)
	}
	if j.Recovered() {
		t.Error("a wiped journal reports Recovered")
	}
	if es := lastEntries(t, j, 10); len(es) != 0 {
		t.Errorf("a wiped journal has entries: %+v", es)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, datadir.IdentityFile)); !bytes.Equal(got, idData) {
		t.Error("identity.json changed")
	}
}

func TestOrphanSidecarsMovedAside(t *testing.T) {
	dir := t.TempDir()
	when := time.Unix(1_770_000_000, 0)
	stale := []byte("an old write-ahead log")
	if err := os.WriteFile(filepath.Join(dir, "journal.db-wal"), stale, 0o600); err != nil {
		t.Fatal(err)
	}
	j := open(t, dir, fixedClock(when))
	if j.Recovered() {
		t.Error("a missing journal with a stale -wal reports Recovered")
	}
	appendEntry(t, j, KindStarted, "web-01", "")
	got, err := os.ReadFile(filepath.Join(dir, "journal.db.orphan-1770000000-wal"))
	if err != nil || !bytes.Equal(got, stale) {
		t.Errorf("the stale -wal was not moved aside whole: %q, %v (dir: %v)", got, err, names(t, dir))
	}
}

// corruptions are journal files Open moves aside, each made from a sound
// journal in dir that is closed.
var corruptions = []struct {
	name   string
	reason string
	make   func(t *testing.T, dir string)
}{
	{"random bytes", "not a database", func(t *testing.T, dir string) {
		junk := make([]byte, 8192)
		rand.Read(junk)
		if err := os.WriteFile(filepath.Join(dir, datadir.JournalFile), junk, 0o600); err != nil {
			t.Fatal(err)
		}
	}},
	{"another database", "no table", func(t *testing.T, dir string) {
		path := filepath.Join(dir, datadir.JournalFile)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		rawExec(t, path, `CREATE TABLE other (x)`, `INSERT INTO other VALUES (1)`)
	}},
	{"no journal id", "no journal id", func(t *testing.T, dir string) {
		rawExec(t, filepath.Join(dir, datadir.JournalFile), `DROP TRIGGER meta_no_delete`, `DELETE FROM meta`)
	}},
	{"damaged pages", "integrity_check", func(t *testing.T, dir string) {
		// Overwrite every page but the first, which keeps the header.
		path := filepath.Join(dir, datadir.JournalFile)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i := 4096; i < len(data); i++ {
			data[i] = 0xA5
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}},
}

// rawExec runs statements on the SQLite file at path outside the package.
func rawExec(t *testing.T, path string, stmts ...string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func TestCorruptJournalMovedAside(t *testing.T) {
	for _, tc := range corruptions {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			idData := writeIdentityFile(t, dir)
			keyData := []byte("-----BEGIN PRIVATE KEY-----\n")
			if err := os.WriteFile(filepath.Join(dir, datadir.KeyFile), keyData, 0o600); err != nil {
				t.Fatal(err)
			}
			j, err := Open(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			old := j.ID()
			for i := range 50 {
				appendEntry(t, j, KindRenewed, "web-01", strings.Repeat("d", 500)+strconv.Itoa(i))
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			tc.make(t, dir)
			corrupt, err := os.ReadFile(filepath.Join(dir, datadir.JournalFile))
			if err != nil {
				t.Fatal(err)
			}

			when := time.Unix(1_770_000_000, 0)
			j = open(t, dir, fixedClock(when))
			if !j.Recovered() {
				t.Fatal("Recovered() = false for a corrupt journal")
			}
			rec := j.Recovery()
			if !strings.Contains(rec.Reason, tc.reason) {
				t.Errorf("Recovery().Reason = %q, want it to contain %q", rec.Reason, tc.reason)
			}
			aside := filepath.Join(dir, "journal.db.corrupt-1770000000")
			if len(rec.MovedTo) == 0 || rec.MovedTo[0] != aside {
				t.Errorf("Recovery().MovedTo = %v, want %s first", rec.MovedTo, aside)
			}
			if got, err := os.ReadFile(aside); err != nil || !bytes.Equal(got, corrupt) {
				t.Errorf("the corrupt journal was not moved aside unchanged (%v)", err)
			}
			if j.ID() == old || !validID(j.ID()) {
				t.Errorf("ID() = %q after recovery, want a new id (old %s)", j.ID(), old)
			}
			if es := lastEntries(t, j, 10); len(es) != 0 {
				t.Errorf("the new journal has entries: %+v", es)
			}
			appendEntry(t, j, KindStarted, "web-01", "")
			if got, _ := os.ReadFile(filepath.Join(dir, datadir.IdentityFile)); !bytes.Equal(got, idData) {
				t.Error("identity.json changed")
			}
			if got, _ := os.ReadFile(filepath.Join(dir, datadir.KeyFile)); !bytes.Equal(got, keyData) {
				t.Error("node.key changed")
			}
			checkMode(t, filepath.Join(dir, datadir.JournalFile))
		})
	}
}

func TestCorruptTwiceInOneSecond(t *testing.T) {
	dir := t.TempDir()
	when := fixedClock(time.Unix(1_770_000_000, 0))
	for i := range 2 {
		if err := os.WriteFile(filepath.Join(dir, datadir.JournalFile), bytes.Repeat([]byte{byte(i + 1)}, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
		j, err := Open(dir, when)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for i, name := range []string{"journal.db.corrupt-1770000000", "journal.db.corrupt-1770000000.1"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte(i + 1)}, 4096)) {
			t.Errorf("%s does not hold corrupt journal %d (%v); dir: %v", name, i+1, err, names(t, dir))
		}
	}
}

func TestNewerJournalNotMoved(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	rawExec(t, filepath.Join(dir, datadir.JournalFile), `PRAGMA user_version = 2`)
	before := names(t, dir)

	if j, err := Open(dir, nil); err == nil {
		j.Close()
		t.Fatal("Open succeeded on a journal of a newer format")
	} else if !strings.Contains(err.Error(), "upgrade bcd") {
		t.Errorf("error %q does not say the way back", err)
	}
	if _, _, err := ReadLast(dir, 1); err == nil || !strings.Contains(err.Error(), "upgrade bcd") {
		t.Errorf("ReadLast: err = %v, want the newer format", err)
	}
	if after := names(t, dir); !slices.Equal(after, before) {
		t.Errorf("files changed from %v to %v", before, after)
	}
}

func TestOpenNeedsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	if j, err := Open(dir, nil); err == nil {
		j.Close()
		t.Fatal("Open succeeded without a data directory")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open created the data directory: %v", err)
	}
}

func checkMode(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode().Perm(); m != 0o600 {
		t.Errorf("%s has mode %o, want 600", filepath.Base(path), m)
	}
}

func TestFileMode(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, nil)
	appendEntry(t, j, KindJoined, "web-01", "")
	for _, name := range journalNames() {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err == nil {
			checkMode(t, path)
		}
	}
	checkMode(t, filepath.Join(dir, datadir.JournalFile))
}

func TestReadLastMissing(t *testing.T) {
	dir := t.TempDir()
	id, es, err := ReadLast(dir, 5)
	if id != "" || es != nil || err != nil {
		t.Errorf("ReadLast of a missing journal = %q, %v, %v; want \"\", nil, nil", id, es, err)
	}
	if got := names(t, dir); len(got) != 0 {
		t.Errorf("ReadLast created %v", got)
	}
}

func TestReadLast(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	j, err := Open(dir, c.now)
	if err != nil {
		t.Fatal(err)
	}
	appendEntry(t, j, KindJoined, "web-01", "")
	appendEntry(t, j, KindStarted, "web-01", "")
	id := j.ID()
	want := lastEntries(t, j, 1)

	// While the journal is open for writing.
	gotID, got, err := ReadLast(dir, 1)
	if err != nil || gotID != id || !slices.Equal(got, want) {
		t.Errorf("ReadLast while open = %q, %+v, %v; want %q, %+v", gotID, got, err, id, want)
	}

	// After it is closed: nothing may be created, changed or moved.
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	before := listDir(t, dir)
	gotID, got, err = ReadLast(dir, 10)
	if err != nil || gotID != id || len(got) != 2 || got[0].Kind != KindStarted || got[1].Kind != KindJoined {
		t.Errorf("ReadLast after close = %q, %+v, %v", gotID, got, err)
	}
	if after := listDir(t, dir); !slices.Equal(after, before) {
		t.Errorf("ReadLast changed the directory from %v to %v", before, after)
	}
}

func TestReadLastCorrupt(t *testing.T) {
	dir := t.TempDir()
	junk := bytes.Repeat([]byte("junk"), 1024)
	if err := os.WriteFile(filepath.Join(dir, datadir.JournalFile), junk, 0o600); err != nil {
		t.Fatal(err)
	}
	before := listDir(t, dir)
	if _, _, err := ReadLast(dir, 1); err == nil {
		t.Error("ReadLast of a corrupt journal succeeded")
	}
	if after := listDir(t, dir); !slices.Equal(after, before) {
		t.Errorf("ReadLast changed the directory from %v to %v", before, after)
	}
}

func TestConcurrentCreate(t *testing.T) {
	dir := t.TempDir()
	const n = 4
	ids := make(chan string, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			j, err := Open(dir, nil)
			if err != nil {
				errs <- err
				return
			}
			defer j.Close()
			if j.Recovered() {
				errs <- fmt.Errorf("a journal created concurrently reports Recovered: %+v", j.Recovery())
				return
			}
			if err := j.Append(context.Background(), KindStarted, "web-01", ""); err != nil {
				errs <- err
				return
			}
			ids <- j.ID()
		}()
	}
	var got []string
	for range n {
		select {
		case err := <-errs:
			t.Fatal(err)
		case id := <-ids:
			got = append(got, id)
		}
	}
	for _, id := range got[1:] {
		if id != got[0] {
			t.Fatalf("concurrent Opens created different journals: %v", got)
		}
	}
	if _, es, err := ReadLast(dir, 10); err != nil || len(es) != n {
		t.Errorf("ReadLast = %d entries, %v; want %d", len(es), err, n)
	}
}

func TestRevocation(t *testing.T) {
	cases := []struct {
		name    string
		entries [][2]string // kind, node, oldest first
		want    string      // the kind found, "" for none
	}{
		{"no journal entry is no revocation", nil, ""},
		{"a revocation of the node is found", [][2]string{{KindJoined, "n1"}, {KindRenewed, "n1"}, {KindRevoked, "n1"}}, KindRevoked},
		{"a refusal of the certificate counts as one", [][2]string{{KindJoined, "n1"}, {KindRefused, "n1"}, {KindStarted, "n1"}}, KindRefused},
		{"a join after the revocation ends it", [][2]string{{KindRevoked, "n1"}, {KindReset, "n1"}, {KindJoined, "n1"}}, ""},
		{"another node's revocation is not this node's", [][2]string{{KindJoined, "n1"}, {KindRevoked, "n0"}}, ""},
		{"failed renewals are no revocation", [][2]string{{KindJoined, "n1"}, {KindRenewalFailed, "n1"}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.entries != nil {
				j := open(t, dir, newClock().now)
				for _, e := range tc.entries {
					appendEntry(t, j, e[0], e[1], "detail of "+e[0])
				}
				j.Close()
			}
			got, err := Revocation(dir, "n1")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == "" && got != nil:
				t.Errorf("Revocation = %+v, want none", got)
			case tc.want != "" && (got == nil || got.Kind != tc.want || got.Detail != "detail of "+tc.want):
				t.Errorf("Revocation = %+v, want a %s entry", got, tc.want)
			}
		})
	}
}
