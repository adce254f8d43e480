package journal

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	// The pure Go SQLite driver, registered as "sqlite"; its Error type tells
	// a corrupt file from a failure to open one.
	sqlite "modernc.org/sqlite"

	"github.com/nodetrust/nodetrust/internal/atomicfile"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
)

// The kinds of entry bcd appends.
const (
	KindJoined        = "joined"
	KindRenewed       = "renewed"
	KindRenewalFailed = "renewal failed"
	KindRevoked       = "revoked"
	// KindRefused is the control plane refusing the node certificate when
	// a session opens (revoked while the node was away, say).
	KindRefused = "refused"
	KindReset   = "reset"
	KindStarted = "started"
)

// MaxDetail is the most bytes of an entry's Detail the journal keeps. Append
// cuts a longer detail at a character boundary and ends it with "…".
const MaxDetail = 1024

// maxKind is the longest kind Append accepts, in bytes.
const maxKind = 64

// Entry is one entry of the journal.
type Entry struct {
	// Seq numbers the entries in the order they were appended, from 1. A
	// number is never reused.
	Seq int64
	// Time is when the entry was appended, by the clock Open was given, in
	// UTC.
	Time time.Time
	// Kind is what happened, one of the Kind constants.
	Kind string
	// NodeID is the node the entry is about; empty when there is none.
	NodeID string
	// Detail is free text for an operator, at most MaxDetail bytes.
	Detail string
}

// Recovery describes a corrupt journal that Open moved aside.
type Recovery struct {
	// Reason says what was wrong, such as "file is not a database (26)".
	Reason string
	// MovedTo holds the new paths of journal.db and of those of its SQLite
	// sidecars (-wal, -shm, -journal) that existed.
	MovedTo []string
}

const (
	// schemaVersion is the journal format (PRAGMA user_version) this package
	// writes and reads.
	schemaVersion = 1
	// busyTimeout is how long a statement waits for a lock another process
	// (bcd node, bcd join) holds on the journal.
	busyTimeout = 5 * time.Second
	// metaJournalID is the meta key of the journal id.
	metaJournalID = "journal_id"
)

// schema creates a journal. The triggers make the tables append-only for
// every writer, not only for this package.
var schema = []string{
	`CREATE TABLE meta (
		key   TEXT PRIMARY KEY,
		value TEXT NOT NULL
	) STRICT`,
	`CREATE TABLE entries (
		seq     INTEGER PRIMARY KEY AUTOINCREMENT,
		time    TEXT NOT NULL,
		kind    TEXT NOT NULL,
		node_id TEXT NOT NULL,
		detail  TEXT NOT NULL
	) STRICT`,
	`CREATE TRIGGER meta_no_update BEFORE UPDATE ON meta
		BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END`,
	`CREATE TRIGGER meta_no_delete BEFORE DELETE ON meta
		BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END`,
	`CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
		BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END`,
	`CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
		BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END`,
	`PRAGMA user_version = ` + strconv.Itoa(schemaVersion),
}

// Journal is an open journal. It is safe for concurrent use.
type Journal struct {
	db       *sql.DB
	id       string
	now      func() time.Time
	recovery Recovery
	// recovered is set when Open moved a corrupt journal aside.
	recovered bool
}

// Open opens the journal in dir, <dir>/journal.db, or creates it with mode
// 0600 and a new journal id. dir must exist.
//
// A journal that is corrupt (not an SQLite database, failing integrity_check,
// missing its tables or its journal id) is moved aside, with its -wal, -shm
// and -journal files, as journal.db.corrupt-<unix time> (journal.db.corrupt-
// <unix time>-wal and so on; a counter is added when the name is taken), and
// a new journal with a new id is created. Recovered then reports true and
// Recovery what was moved, for the caller to log.
//
// A missing journal, one that was wiped, starts over with a new id;
// Recovered reports false. Sidecars left without their journal.db are moved
// aside first as journal.db.orphan-<unix time>-wal and so on, so SQLite does
// not replay an old write-ahead log into the new journal.
//
// Concurrent Opens of the same journal, in one process or several, take
// turns on an advisory lock of dir while they decide what is missing or
// corrupt, so that one never moves aside the journal another just created.
//
// A journal that cannot be opened for another reason (permissions, a lock
// held past the busy timeout, an I/O error, a newer journal format) is not
// moved: Open returns the error. Open never touches another file of dir, so
// the identity survives a lost journal.
//
// now is the clock of the entries' times; nil means time.Now. The caller
// must Close the journal.
func Open(dir string, now func() time.Time) (*Journal, error) {
	if now == nil {
		now = time.Now
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("open the journal: data directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("open the journal: data directory %s is not a directory", dir)
	}
	path := datadir.Layout(dir).Journal()
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open the journal: %w", err)
	}
	defer unlock()

	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		if _, err := moveAside(dir, sidecarNames(), ".orphan-", now); err != nil {
			return nil, fmt.Errorf("open the journal: move aside the sidecars of a missing %s: %w", path, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("open the journal: %w", err)
	}

	j := &Journal{now: now}
	j.db, j.id, err = openChecked(path)
	var ce *corruptError
	if errors.As(err, &ce) {
		moved, merr := moveAside(dir, journalNames(), ".corrupt-", now)
		if merr != nil {
			return nil, fmt.Errorf("open the journal: %s is corrupt (%s) and could not be moved aside: %w; move it and its -wal and -shm files aside, then start bcd again",
				path, ce.reason, merr)
		}
		j.recovered = true
		j.recovery = Recovery{Reason: ce.reason, MovedTo: moved}
		j.db, j.id, err = openChecked(path)
	}
	if err != nil {
		return nil, fmt.Errorf("open the journal %s: %w", path, err)
	}
	return j, nil
}

// ID returns the journal id: 32 lowercase hex digits (128 random bits),
// created with the journal. A journal that starts over has a new id.
func (j *Journal) ID() string { return j.id }

// Recovered reports whether Open found the journal corrupt, moved it aside
// and created a new one.
func (j *Journal) Recovered() bool { return j.recovered }

// Recovery describes the corrupt journal Open moved aside; it is the zero
// Recovery unless Recovered reports true.
func (j *Journal) Recovery() Recovery {
	r := j.recovery
	r.MovedTo = append([]string(nil), r.MovedTo...)
	return r
}

// Append adds an entry with the time from the journal's clock and returns
// once it is durable (synchronous=FULL). kind must be non-empty and at most
// 64 bytes; it is normally one of the Kind constants. A detail longer than
// MaxDetail bytes is cut; invalid UTF-8 is replaced by U+FFFD.
func (j *Journal) Append(ctx context.Context, kind, nodeID, detail string) error {
	if kind == "" {
		return errors.New("append to the journal: empty kind")
	}
	if len(kind) > maxKind {
		return fmt.Errorf("append to the journal: kind is longer than %d bytes", maxKind)
	}
	t := j.now().UTC().Format(time.RFC3339Nano)
	_, err := j.db.ExecContext(ctx,
		`INSERT INTO entries (time, kind, node_id, detail) VALUES (?, ?, ?, ?)`,
		t, strings.ToValidUTF8(kind, "\uFFFD"), strings.ToValidUTF8(nodeID, "\uFFFD"), capDetail(detail))
	if err != nil {
		return fmt.Errorf("append %q to the journal: %w", kind, err)
	}
	return nil
}

// Last returns the newest n entries, newest first; fewer when the journal
// holds fewer, none for n <= 0.
func (j *Journal) Last(ctx context.Context, n int) ([]Entry, error) {
	entries, err := last(ctx, j.db, n)
	if err != nil {
		return nil, fmt.Errorf("read the journal: %w", err)
	}
	return entries, nil
}

// Close closes the journal. Calls in flight may fail.
func (j *Journal) Close() error {
	if err := j.db.Close(); err != nil {
		return fmt.Errorf("close the journal: %w", err)
	}
	return nil
}

// ReadLast reads the journal in dir without creating, changing or moving any
// file, for bcd status: it returns the journal id and the newest n entries,
// newest first. A missing journal returns ("", nil, nil). A corrupt journal
// is an error; ReadLast does not recover it (Open does).
//
// While no process has the journal open (no -wal or -shm file beside it),
// ReadLast reads journal.db as immutable, so SQLite creates no -wal or -shm
// file either. If a writer checkpoints at that very moment, the read may
// fail; calling ReadLast again then succeeds.
func ReadLast(dir string, n int) (id string, entries []Entry, err error) {
	path := datadir.Layout(dir).Journal()
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return "", nil, nil
	} else if err != nil {
		return "", nil, fmt.Errorf("read the journal: %w", err)
	}

	q := url.Values{
		"mode":          {"ro"},
		"_busy_timeout": {strconv.FormatInt(busyTimeout.Milliseconds(), 10)},
		"_query_only":   {"1"},
	}
	if !anyExists(dir, sidecarNames()) {
		q.Set("immutable", "1")
	}
	db, err := sql.Open("sqlite", dsn(path, q))
	if err != nil {
		return "", nil, fmt.Errorf("read the journal %s: %w", path, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)

	ctx := context.Background()
	fail := func(err error) (string, []Entry, error) {
		return "", nil, fmt.Errorf("read the journal %s: %w; bcd moves a corrupt journal aside the next time it opens it for writing", path, err)
	}
	var version int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fail(err)
	}
	if version > schemaVersion {
		return "", nil, fmt.Errorf("read the journal %s: %w", path, newerError(version))
	}
	if err := db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, metaJournalID).Scan(&id); err != nil {
		return fail(err)
	}
	entries, err = last(ctx, db, n)
	if err != nil {
		return fail(err)
	}
	return id, entries, nil
}

// revocationWindow is how many of the newest entries Revocation reads.
const revocationWindow = 256

// Revocation reads the journal in dir like [ReadLast] and returns the entry
// that ended nodeID's current certificate — the newest entry for nodeID when
// it is a revocation ([KindRevoked]) or a refusal of the certificate
// ([KindRefused]) — or nil when the newest such entry says it lives (joined,
// renewed) or there is none. A journal that cannot be read returns its
// error; a missing one returns nil.
func Revocation(dir, nodeID string) (*Entry, error) {
	_, entries, err := ReadLast(dir, revocationWindow)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.NodeID != nodeID {
			continue
		}
		switch e.Kind {
		case KindRevoked, KindRefused:
			return &e, nil
		case KindJoined, KindRenewed, KindReset:
			return nil, nil
		}
	}
	return nil, nil
}

// corruptError is a journal Open moves aside.
type corruptError struct {
	reason string
	err    error // the SQLite error, if any
}

func (e *corruptError) Error() string { return "the journal is corrupt: " + e.reason }
func (e *corruptError) Unwrap() error { return e.err }

// SQLite's primary result codes that mean the file is not a sound database.
const (
	sqliteCorrupt = 11 // SQLITE_CORRUPT
	sqliteNotADB  = 26 // SQLITE_NOTADB
)

// classify returns err as a corruptError when SQLite says the file is
// corrupt or not a database, and otherwise wrapped with what was being done.
func classify(err error, what string) error {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqliteCorrupt, sqliteNotADB:
			return &corruptError{reason: se.Error(), err: err}
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// newerError describes a journal written by a newer bcd. It is not moved
// aside: a downgrade must not throw the journal away.
func newerError(version int) error {
	return fmt.Errorf("the journal has format %d, which this bcd cannot read; upgrade bcd, or move %s aside to start a new journal",
		version, datadir.JournalFile)
}

// openChecked opens the journal at path, creating it with mode 0600 and
// initializing an empty database, and checks it. A journal to move aside
// gives a *corruptError.
func openChecked(path string) (*sql.DB, string, error) {
	// SQLite would create the file with mode 0644; create it first so that
	// it, and the -wal and -shm files SQLite gives the same mode, are 0600.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, "", err
	}
	if err := f.Close(); err != nil {
		return nil, "", err
	}
	db, err := sql.Open("sqlite", dsn(path, url.Values{
		"mode":          {"rw"},
		"_busy_timeout": {strconv.FormatInt(busyTimeout.Milliseconds(), 10)},
		"_synchronous":  {"FULL"},
		"_txlock":       {"immediate"},
	}))
	if err != nil {
		return nil, "", err
	}
	// One connection: the journal is small and written rarely, and every
	// write then goes through the same connection.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	id, err := prepare(context.Background(), db)
	if err != nil {
		if cerr := db.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, "", err
	}
	return db, id, nil
}

// prepare checks the journal's integrity and format, switches it to WAL,
// creates the schema in an empty database, and returns the journal id. A
// database that is not a sound journal is reported before anything in it
// changes.
func prepare(ctx context.Context, db *sql.DB) (string, error) {
	if err := checkIntegrity(ctx, db); err != nil {
		return "", err
	}
	version, tables, err := schemaState(ctx, db)
	if err != nil {
		return "", err
	}
	// A new file, or one an interrupted Open left empty.
	empty := version == 0 && len(tables) == 0
	if !empty {
		if err := checkSchema(version, tables); err != nil {
			return "", err
		}
		if _, err := readID(ctx, db); err != nil {
			return "", err
		}
	}

	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode); err != nil {
		return "", classify(err, "set the journal mode")
	}
	if !strings.EqualFold(mode, "wal") {
		return "", fmt.Errorf("journal mode is %q, want wal (is the data directory on a file system without shared memory?)", mode)
	}
	var sync int
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		return "", classify(err, "read synchronous")
	}
	if sync != 2 { // FULL
		return "", fmt.Errorf("synchronous is %d, want 2 (FULL)", sync)
	}

	if empty {
		if err := initialize(ctx, db); err != nil {
			return "", err
		}
		if version, tables, err = schemaState(ctx, db); err != nil {
			return "", err
		}
		if err := checkSchema(version, tables); err != nil {
			return "", err
		}
	}
	return readID(ctx, db)
}

// checkSchema checks a journal's format and tables.
func checkSchema(version int, tables map[string]bool) error {
	if version > schemaVersion {
		return newerError(version)
	}
	for _, want := range []string{"meta", "entries"} {
		if !tables[want] {
			return &corruptError{reason: "no table " + want}
		}
	}
	if version != schemaVersion {
		return &corruptError{reason: fmt.Sprintf("journal format %d", version)}
	}
	return nil
}

// readID returns the journal id.
func readID(ctx context.Context, db *sql.DB) (string, error) {
	var id string
	err := db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, metaJournalID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", &corruptError{reason: "no journal id"}
	}
	if err != nil {
		return "", classify(err, "read the journal id")
	}
	if !validID(id) {
		return "", &corruptError{reason: fmt.Sprintf("malformed journal id %q", id)}
	}
	return id, nil
}

// checkIntegrity runs PRAGMA integrity_check.
func checkIntegrity(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, "PRAGMA integrity_check(3)")
	if err != nil {
		return classify(err, "check the journal's integrity")
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return classify(err, "check the journal's integrity")
		}
		problems = append(problems, strings.Join(strings.Fields(s), " "))
	}
	if err := rows.Err(); err != nil {
		return classify(err, "check the journal's integrity")
	}
	if len(problems) == 1 && problems[0] == "ok" {
		return nil
	}
	return &corruptError{reason: "integrity_check: " + strings.Join(problems, "; ")}
}

// schemaState returns the database's user_version and the names of its
// tables, read in one statement so that both come from the same snapshot
// while another process may be creating the journal.
func schemaState(ctx context.Context, db *sql.DB) (int, map[string]bool, error) {
	var version int
	var names sql.NullString
	err := db.QueryRowContext(ctx, `SELECT
		(SELECT user_version FROM pragma_user_version),
		(SELECT group_concat(name, char(31)) FROM sqlite_master WHERE type = 'table')`).Scan(&version, &names)
	if err != nil {
		return 0, nil, classify(err, "read the journal's format")
	}
	tables := map[string]bool{}
	if names.Valid {
		for _, name := range strings.Split(names.String, "\x1f") {
			tables[name] = true
		}
	}
	return version, tables, nil
}

// initialize creates the schema and the journal id in one transaction,
// unless another process did so first.
func initialize(ctx context.Context, db *sql.DB) error {
	id, err := newID()
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE
	if err != nil {
		return fmt.Errorf("create the journal: %w", err)
	}
	defer tx.Rollback()
	var version int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return classify(err, "create the journal")
	}
	if version != 0 {
		return nil // created by another process meanwhile
	}
	for _, stmt := range schema {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return classify(err, "create the journal")
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES (?, ?)`, metaJournalID, id); err != nil {
		return classify(err, "create the journal")
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create the journal: %w", err)
	}
	return nil
}

// newID returns a new journal id.
func newID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("create a journal id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// validID reports whether id has the form newID gives.
func validID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// last returns the newest n entries of db, newest first.
func last(ctx context.Context, db *sql.DB, n int) ([]Entry, error) {
	if n <= 0 {
		return nil, nil
	}
	rows, err := db.QueryContext(ctx,
		`SELECT seq, time, kind, node_id, detail FROM entries ORDER BY seq DESC LIMIT ?`, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var entries []Entry
	for rows.Next() {
		var e Entry
		var t string
		if err := rows.Scan(&e.Seq, &t, &e.Kind, &e.NodeID, &e.Detail); err != nil {
			return nil, err
		}
		if e.Time, err = time.Parse(time.RFC3339Nano, t); err != nil {
			return nil, fmt.Errorf("entry %d: time: %w", e.Seq, err)
		}
		entries = append(entries, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return entries, nil
}

// capDetail makes detail valid UTF-8 of at most MaxDetail bytes.
func capDetail(detail string) string {
	detail = strings.ToValidUTF8(detail, "\uFFFD")
	if len(detail) <= MaxDetail {
		return detail
	}
	const ellipsis = "…"
	cut := MaxDetail - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(detail[cut]) {
		cut--
	}
	return detail[:cut] + ellipsis
}

// dsn returns the driver name for the file at path with the parameters q.
// It is a file: URI, so SQLite applies mode and immutable, and any byte of
// the path reaches SQLite as it is.
func dsn(path string, q url.Values) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}
	return u.String()
}

// journalNames returns journal.db and its sidecars' names, journal.db first.
func journalNames() []string { return datadir.JournalFiles() }

// sidecarNames returns the names of journal.db's sidecars.
func sidecarNames() []string {
	var names []string
	for _, s := range datadir.JournalSidecars {
		names = append(names, datadir.JournalFile+s)
	}
	return names
}

// anyExists reports whether any of names exists in dir.
func anyExists(dir string, names []string) bool {
	for _, name := range names {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}

// moveAside renames those of names that exist in dir to carry the tag
// <prefix><unix time of now()> (for a sidecar between journal.db and its suffix,
// so SQLite still pairs them), adding .N when a name is taken, and returns
// their new paths. journal.db, when among names, moves first.
func moveAside(dir string, names []string, prefix string, now func() time.Time) ([]string, error) {
	var present []string
	for _, name := range names {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			present = append(present, name)
		}
	}
	if len(present) == 0 {
		return nil, nil
	}
	base := prefix + strconv.FormatInt(now().Unix(), 10)
	tag := base
	for n := 1; anyExists(dir, taggedNames(present, tag)); n++ {
		tag = base + "." + strconv.Itoa(n)
	}
	var moved []string
	for _, name := range present {
		to := filepath.Join(dir, taggedName(name, tag))
		if err := atomicfile.Rename(filepath.Join(dir, name), to); err != nil {
			return moved, fmt.Errorf("move %s aside: %w", name, err)
		}
		moved = append(moved, to)
	}
	return moved, nil
}

func taggedNames(names []string, tag string) []string {
	out := make([]string, len(names))
	for i, name := range names {
		out[i] = taggedName(name, tag)
	}
	return out
}

// taggedName is name with tag: journal.db.<tag>, journal.db.<tag>-wal.
func taggedName(name, tag string) string {
	if rest, ok := strings.CutPrefix(name, datadir.JournalFile); ok {
		return datadir.JournalFile + tag + rest
	}
	return name + tag
}
