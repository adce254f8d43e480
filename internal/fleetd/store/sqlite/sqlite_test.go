package sqlite

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/benchcpu"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return openTemp(t)
	})
}

// openTemp opens a store in a new file under t.TempDir(); the caller
// closes it.
func openTemp(t testing.TB) *DB {
	t.Helper()
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "fleetd.db"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return db
}

// mustOpen opens the store at path and closes it when the test ends.
func mustOpen(t *testing.T, path string) *DB {
	t.Helper()
	db, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mustClose(t *testing.T, db *DB) {
	t.Helper()
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// testJoin is a join of node id at generation 1 spending the token whose
// hash is tokenHash (none when nil).
func testJoin(tokenHash []byte, id, serial string, now time.Time) store.Join {
	return store.Join{
		TokenHash: tokenHash,
		Now:       now,
		Node: store.Node{
			ID: id, SPIFFEID: "spiffe://example.org/node/" + id, Role: "worker", Site: "a",
			State: store.StateActive, Generation: 1, Attestor: "token",
			Claims: store.Claims{
				ProductUUID: "uuid-" + id, Serials: []string{"board-" + id},
				MACs: []string{"02:00:00:00:00:01"}, Hostname: id,
			},
			JoinedAt: now, LastSeen: now, CertSerial: serial, CertNotAfter: now.Add(24 * time.Hour),
		},
		Cert: store.Cert{Serial: serial, NodeID: id, Generation: 1, Kind: "join",
			IssuedAt: now, NotAfter: now.Add(24 * time.Hour)},
	}
}

func testToken(id string, created time.Time) store.Token {
	return store.Token{ID: id, Hash: hash(id), Role: "worker", Site: "a", CreatedBy: "admin",
		CreatedAt: created, ExpiresAt: created.Add(time.Hour)}
}

func TestReopenKeepsData(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "fleetd.db")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	db := mustOpen(t, path)
	tok := testToken("tok1", now)
	if err := db.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	j := testJoin(tok.Hash, "node-1", "s1", now.Add(time.Minute))
	if err := db.CompleteJoin(ctx, j); err != nil {
		t.Fatal(err)
	}
	ev := store.AuditEvent{Time: now, Actor: "join", Action: "join", Subject: "node-1"}
	if err := db.AppendAudit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	mustClose(t, db)

	db = mustOpen(t, path)
	gotTok, err := db.TokenByHash(ctx, tok.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if gotTok.UsedBy != "node-1" || !gotTok.UsedAt.Equal(j.Now) {
		t.Errorf("token after reopen: %+v", gotTok)
	}
	n, err := db.GetNode(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(n, j.Node) {
		t.Errorf("node after reopen:\n got  %+v\n want %+v", n, j.Node)
	}
	if c, err := db.GetCert(ctx, "s1"); err != nil || !reflect.DeepEqual(c, j.Cert) {
		t.Errorf("certificate after reopen = %+v, %v; want %+v", c, err, j.Cert)
	}
	if es, err := db.ListAudit(ctx, 10); err != nil || len(es) != 1 || !reflect.DeepEqual(es[0], ev) {
		t.Errorf("audit after reopen = %+v, %v; want [%+v]", es, err, ev)
	}
}

func TestTimesKeepNanosecondsAndReadBackInUTC(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	created := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("X", -7*3600))
	tok := testToken("tok1", created)
	if err := db.CreateToken(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	got, err := db.TokenByHash(t.Context(), tok.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if got.CreatedAt != created.UTC() || got.ExpiresAt != created.Add(time.Hour).UTC() {
		t.Errorf("times read back as %v, %v; want %v, %v", got.CreatedAt, got.ExpiresAt, created.UTC(), created.Add(time.Hour).UTC())
	}
	if got.UsedAt != (time.Time{}) {
		t.Errorf("zero UsedAt read back as %v", got.UsedAt)
	}
}

func TestTimesOutsideTheStorableRangeAreRefused(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	tok := testToken("tok1", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tok.ExpiresAt = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	err := db.CreateToken(t.Context(), tok)
	if err == nil || !strings.Contains(err.Error(), "storable range") {
		t.Fatalf("CreateToken with expiry in year 3000: %v, want a range error", err)
	}
	if _, err := db.TokenByHash(t.Context(), tok.Hash); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("refused token was stored: %v", err)
	}
}

func TestMigrationsRunOnce(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "fleetd.db")

	db := mustOpen(t, path)
	applied := readMigrations(t, db)
	if len(applied) != len(migrations) {
		t.Fatalf("schema_migrations has %d rows, want %d", len(applied), len(migrations))
	}
	mustClose(t, db)

	// Reopening applies nothing: the initial migration is not idempotent
	// (CREATE TABLE without IF NOT EXISTS), so a second run would fail,
	// and the recorded times stay those of the first run.
	db = mustOpen(t, path)
	if again := readMigrations(t, db); !reflect.DeepEqual(again, applied) {
		t.Errorf("schema_migrations after reopen = %v, want %v", again, applied)
	}
	mustClose(t, db)

	// A migration that counts its runs, opened three times, runs once; a
	// migration added later runs once, after it.
	counting := []string{`CREATE TABLE runs (n INTEGER); INSERT INTO runs VALUES (1)`}
	path = filepath.Join(t.TempDir(), "counting.db")
	for range 3 {
		db, err := open(ctx, path, counting)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		mustClose(t, db)
	}
	db, err := open(ctx, path, append(counting, `INSERT INTO runs VALUES (2)`))
	if err != nil {
		t.Fatalf("open with a second migration: %v", err)
	}
	defer db.Close()
	var runs string
	if err := db.w.QueryRowContext(ctx, `SELECT group_concat(n, ',') FROM runs`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if runs != "1,2" {
		t.Errorf("migration runs %q, want \"1,2\"", runs)
	}
	if got := readMigrations(t, db); len(got) != 2 {
		t.Errorf("schema_migrations = %v, want versions 1 and 2", got)
	}
}

// readMigrations returns the applied_at of each version.
func readMigrations(t *testing.T, db *DB) map[int]int64 {
	t.Helper()
	rows, err := db.r.QueryContext(t.Context(), `SELECT version, applied_at FROM schema_migrations`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[int]int64{}
	for rows.Next() {
		var v int
		var at int64
		if err := rows.Scan(&v, &at); err != nil {
			t.Fatal(err)
		}
		m[v] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// A file written by a fleetd of schema version 1 upgrades in place: its
// data stays and the pending joins of version 2 work.
func TestASchema1FileUpgradesKeepingItsData(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "fleetd.db")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	old, err := open(ctx, path, migrations[:1])
	if err != nil {
		t.Fatalf("open at schema 1: %v", err)
	}
	tok := testToken("tok1", now)
	if err := old.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	j := testJoin(nil, "node-1", "s1", now)
	// The node row as a schema-1 fleetd wrote it: today's code writes
	// columns that schema lacks.
	if _, err := old.w.ExecContext(ctx, `INSERT INTO nodes (id, spiffe_id, role, site, state, generation, attestor,
		product_uuid, macs, gpu_uuids, hostname, boot_id, daemon_version, joined_at, last_seen, cert_serial, cert_not_after)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		j.Node.ID, j.Node.SPIFFEID, j.Node.Role, j.Node.Site, j.Node.State, int64(j.Node.Generation), j.Node.Attestor,
		j.Node.Claims.ProductUUID, jsonList(t, j.Node.Claims.MACs), jsonList(t, j.Node.Claims.GPUUUIDs), j.Node.Claims.Hostname, j.Node.Claims.BootID, j.Node.DaemonVersion,
		j.Node.JoinedAt.UnixNano(), j.Node.LastSeen.UnixNano(), j.Node.CertSerial, j.Node.CertNotAfter.UnixNano()); err != nil {
		t.Fatal(err)
	}
	for i, serial := range j.Node.Claims.Serials {
		if _, err := old.w.ExecContext(ctx, `INSERT INTO node_serials (node_id, pos, serial) VALUES (?, ?, ?)`, j.Node.ID, i, serial); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, old)

	db := mustOpen(t, path)
	if got := readMigrations(t, db); len(got) != len(migrations) {
		t.Fatalf("schema_migrations after the upgrade = %v, want %d versions", got, len(migrations))
	}
	if got, err := db.TokenByHash(ctx, tok.Hash); err != nil || !reflect.DeepEqual(got, tok) {
		t.Errorf("token after the upgrade = %+v, %v; want %+v", got, err, tok)
	}
	if n, err := db.GetNode(ctx, "node-1"); err != nil || !reflect.DeepEqual(n, j.Node) {
		t.Errorf("node after the upgrade = %+v, %v; want %+v", n, err, j.Node)
	}
	p := store.Pending{ID: "p1", TokenHash: tok.Hash, TokenID: tok.ID, NodeID: "node-2",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := db.CreatePending(ctx, p); err != nil {
		t.Fatalf("CreatePending after the upgrade: %v", err)
	}
	if got, err := db.GetPending(ctx, "p1"); err != nil || !reflect.DeepEqual(got, p) {
		t.Errorf("pending join = %+v, %v; want %+v", got, err, p)
	}
}

func TestAPendingJoinWithoutAnIDOrANodeIsRefused(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, p := range []store.Pending{
		{NodeID: "node-1", CreatedAt: now, ExpiresAt: now.Add(time.Hour)},
		{ID: "p1", CreatedAt: now, ExpiresAt: now.Add(time.Hour)},
	} {
		if err := db.CreatePending(t.Context(), p); err == nil {
			t.Errorf("CreatePending(%+v) succeeded", p)
		}
	}
	if ps, err := db.ListPending(t.Context(), now); err != nil || len(ps) != 0 {
		t.Errorf("ListPending = %v, %v; want none", ps, err)
	}
}

func TestPendingQueriesWithoutATimeAreRefused(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	if _, err := db.ListPending(t.Context(), time.Time{}); err == nil {
		t.Error("ListPending at the zero time succeeded")
	}
	if _, err := db.ApprovePending(t.Context(), "node-1", "owner", time.Time{}); err == nil || errors.Is(err, store.ErrNotFound) {
		t.Errorf("ApprovePending at the zero time: %v, want an error that is not ErrNotFound", err)
	}
}

func TestAFailedMigrationLeavesNoTrace(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "fleetd.db")
	ms := []string{
		`CREATE TABLE a (x INTEGER)`,
		`CREATE TABLE b (x INTEGER); INSERT INTO nonexistent VALUES (1)`,
	}
	if db, err := open(ctx, path, ms); err == nil {
		db.Close()
		t.Fatal("open with a failing migration succeeded")
	} else if !strings.Contains(err.Error(), "apply migration 2") {
		t.Errorf("error %q does not name migration 2", err)
	}
	db, err := open(ctx, path, ms[:1])
	if err != nil {
		t.Fatalf("open with the good migration: %v", err)
	}
	defer db.Close()
	var version int
	if err := db.r.QueryRowContext(ctx, `SELECT max(version) FROM schema_migrations`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != 1 {
		t.Errorf("schema version %d, want 1", version)
	}
	var tables int
	if err := db.r.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE name = 'b'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Error("the failed migration's table b exists")
	}
}

func TestAFutureSchemaIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleetd.db")
	db := mustOpen(t, path)
	if _, err := db.w.ExecContext(t.Context(), `INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)`,
		len(migrations)+1); err != nil {
		t.Fatal(err)
	}
	mustClose(t, db)

	db, err := Open(t.Context(), path)
	if err == nil {
		db.Close()
		t.Fatal("Open of a database with a newer schema succeeded")
	}
	for _, want := range []string{"newer", fmt.Sprint(len(migrations) + 1), "upgrade fleetd"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestFilesAreCreatedPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleetd.db")
	db := mustOpen(t, path)
	// A write makes sure the WAL and its index exist.
	if err := db.AppendAudit(t.Context(), store.AuditEvent{Action: "test"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("stat: %v", err)
			continue
		}
		if mode := fi.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s has mode %#o, want 0600", filepath.Base(p), mode)
		}
	}
}

func TestThePragmasAreSet(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	for _, q := range []struct {
		pool *sql.DB
		name string
		want string
	}{
		{db.w, "journal_mode", "wal"},
		{db.w, "synchronous", "2"},
		{db.w, "foreign_keys", "1"},
		{db.w, "busy_timeout", "10000"},
		{db.r, "foreign_keys", "1"},
		{db.r, "busy_timeout", "10000"},
		{db.r, "query_only", "1"},
	} {
		var got string
		if err := q.pool.QueryRowContext(t.Context(), "PRAGMA "+q.name).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", q.name, err)
		}
		if got != q.want {
			t.Errorf("PRAGMA %s = %s, want %s", q.name, got, q.want)
		}
	}
}

func TestAPathWithURICharactersOpens(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a dir?with#odd%20chars&x=1")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "fleetd.db")
	db := mustOpen(t, path)
	if err := db.AppendAudit(t.Context(), store.AuditEvent{Action: "test"}); err != nil {
		t.Fatal(err)
	}
	mustClose(t, db)
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the database is not at the path given: %v", err)
	}
}

func TestOpenInAMissingDirectoryFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "fleetd.db")
	if db, err := Open(t.Context(), path); err == nil {
		db.Close()
		t.Fatal("Open in a missing directory succeeded")
	} else if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the path", err)
	}
}

// Two stores on one file stand for two processes (fleetd and an admin
// command): SQLite's file locks, not the in-process writer pool, keep them
// apart, and BEGIN IMMEDIATE with the busy timeout keeps them from failing
// with "database is locked".
func TestTwoStoresOnOneFileBothWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleetd.db")
	a, b := mustOpen(t, path), mustOpen(t, path)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const perStore = 25
	for i := range 2 * perStore {
		if err := a.CreateToken(t.Context(), testToken(fmt.Sprintf("tok%02d", i), now)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*perStore)
	for i := range 2 * perStore {
		db := a
		if i%2 == 1 {
			db = b
		}
		wg.Go(func() {
			id := fmt.Sprintf("tok%02d", i)
			errs <- db.CompleteJoin(t.Context(), testJoin(hash(id), fmt.Sprintf("node-%02d", i), fmt.Sprintf("s%02d", i), now))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	ns, err := b.ListNodes(t.Context())
	if err != nil || len(ns) != 2*perStore {
		t.Errorf("ListNodes = %d nodes, %v; want %d", len(ns), err, 2*perStore)
	}
}

// BenchmarkCompleteJoin measures the store's write of a token join: spend
// the token, write the node and its serials, record the certificate, in
// one transaction committed with synchronous=FULL; parallel keeps
// benchInFlight joins in flight, sharing commits, as a busy server does.
func BenchmarkCompleteJoin(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		db, joins := benchSetup(b)
		b.ResetTimer()
		for i := range b.N {
			if err := db.CompleteJoin(context.Background(), joins[i]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		db, joins := benchSetup(b)
		var next, commits atomic.Int64
		db.beforeCommit = func(*sql.Tx, int) { commits.Add(1) }
		b.SetParallelism(benchParallelism())
		b.ResetTimer()
		reportCPU := benchcpu.Start(b)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := db.CompleteJoin(context.Background(), joins[next.Add(1)-1]); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportCPU()
		b.ReportMetric(float64(b.N)/float64(max(commits.Load(), 1)), "joins/commit")
	})
}

// benchSetup opens a store holding b.N unused tokens and returns the b.N
// joins that spend them.
func benchSetup(b *testing.B) (*DB, []store.Join) {
	b.Helper()
	db := openTemp(b)
	b.Cleanup(func() { db.Close() })
	now := time.Now()
	joins := make([]store.Join, b.N)
	// One transaction for all the tokens, so setup stays quick.
	err := db.write(context.Background(), func(t *wtx) error {
		for i := range b.N {
			id := fmt.Sprintf("tok%08d", i)
			var a args
			_, err := t.tx.Exec(`INSERT INTO tokens (`+tokenColumns+`) VALUES (?, ?, 'worker', 'a', '', 0, 0, 'bench', ?, ?, NULL, '')`,
				id, hash(id), a.time(now), a.time(now.Add(time.Hour)))
			if err != nil {
				return err
			}
			joins[i] = testJoin(hash(id), fmt.Sprintf("node-%08d", i), fmt.Sprintf("%016x", i), now)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return db, joins
}

// BenchmarkRecordRenewal measures the store's part of a renewal (no audit
// event): update the node, record the certificate, in one transaction
// committed with synchronous=FULL. parallel is the server's case: under a
// renewal limit, benchInFlight at once, sharing commits; its cpu-ns/op is
// what the store adds to a renewal's crypto floor (docs/performance.md).
func BenchmarkRecordRenewal(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		db, certs := renewalBenchSetup(b)
		b.ResetTimer()
		for i := range b.N {
			if err := db.RecordRenewal(context.Background(), certs[i], nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		db, certs := renewalBenchSetup(b)
		var next, commits atomic.Int64
		db.beforeCommit = func(*sql.Tx, int) { commits.Add(1) }
		// As the server renews: under a limit (here one never reached),
		// counted in the transaction, each node holding about
		// renewalsInWindow earlier renewals in the window.
		limit := store.RenewalLimit{Max: b.N + 1, Window: renewalBenchWindow}
		b.SetParallelism(benchParallelism())
		b.ResetTimer()
		reportCPU := benchcpu.Start(b)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := db.RecordRenewalLimited(context.Background(), certs[next.Add(1)-1], limit, nil); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportCPU()
		b.ReportMetric(float64(b.N)/float64(max(commits.Load(), 1)), "renewals/commit")
	})
	// limited is serial under a renewal limit the renewals stay within,
	// each node holding renewalsInWindow earlier renewals in the window
	// from the start: the count the limit makes in the transaction.
	b.Run("limited", func(b *testing.B) {
		db, certs := renewalBenchSetup(b)
		// Room for every renewal: the earlier ones, then at most
		// renewalsInWindow of the benchmark's own per node.
		limit := store.RenewalLimit{Max: 2*renewalsInWindow + 2, Window: renewalBenchWindow}
		// The earlier renewals, benchInFlight at a time so that they
		// share commits and setup stays quick.
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, benchInFlight)
		for range benchInFlight {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < renewalBenchNodes*renewalsInWindow; i = int(next.Add(1) - 1) {
					c := certs[0]
					c.Serial = fmt.Sprintf("e%015x", i)
					c.NodeID = fmt.Sprintf("node-%08d", i%renewalBenchNodes)
					// 1 ms apart up to the first renewal of the
					// benchmark, as if made before it.
					c.IssuedAt = certs[0].IssuedAt.Add(-time.Duration(renewalBenchNodes*renewalsInWindow-i) * time.Millisecond)
					if err := db.RecordRenewal(context.Background(), c, nil); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		reportCPU := benchcpu.Start(b)
		for i := range b.N {
			if err := db.RecordRenewalLimited(context.Background(), certs[i], limit, nil); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU()
	})
}

// benchInFlight is how many calls the parallel benchmarks keep in flight
// at once (at least one per CPU), as nodetrust-load does by default: the
// group commit's batches are what they would be under that load.
const benchInFlight = 64

// benchParallelism is the b.SetParallelism that keeps at least
// benchInFlight calls in flight: RunParallel starts that many goroutines
// per GOMAXPROCS.
func benchParallelism() int {
	procs := runtime.GOMAXPROCS(0)
	return (benchInFlight + procs - 1) / procs
}

// renewalBenchNodes is the number of joined nodes the renewals of
// BenchmarkRecordRenewal are spread over.
const renewalBenchNodes = 1024

// renewalsInWindow is how many renewals of its node a renewal of
// BenchmarkRecordRenewal finds in the limit's window (the production
// limit is 6). The renewals are issued 1 ms apart, round the nodes, so a
// node renews every renewalBenchNodes ms and renewalBenchWindow holds its
// last renewalsInWindow, whatever b.N.
const (
	renewalsInWindow   = 5
	renewalBenchWindow = renewalsInWindow * renewalBenchNodes * time.Millisecond
)

// renewalBenchSetup opens a store holding renewalBenchNodes joined nodes
// and returns b.N renewals of them, each with its own serial.
func renewalBenchSetup(b *testing.B) (*DB, []store.Cert) {
	b.Helper()
	db := openTemp(b)
	b.Cleanup(func() { db.Close() })
	now := time.Now()
	// One transaction for all the joins, so setup stays quick.
	err := db.write(context.Background(), func(t *wtx) error {
		for i := range renewalBenchNodes {
			j := testJoin(nil, fmt.Sprintf("node-%08d", i), fmt.Sprintf("j%015x", i), now)
			var a args
			c := &joinCall{j: j, now: a.time(j.Now), nodeVals: nodeArgs(&a, j.Node), certVals: certArgs(&a, j.Cert)}
			if a.err != nil {
				return a.err
			}
			if err := c.write(t); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	certs := make([]store.Cert, b.N)
	for i := range b.N {
		issued := now.Add(time.Duration(i+1) * time.Millisecond)
		certs[i] = store.Cert{Serial: fmt.Sprintf("r%015x", i), NodeID: fmt.Sprintf("node-%08d", i%renewalBenchNodes),
			Generation: 1, Kind: "renew", IssuedAt: issued, NotAfter: issued.Add(24 * time.Hour)}
	}
	return db, certs
}

func jsonList(t *testing.T, l []string) string {
	t.Helper()
	if l == nil {
		l = []string{}
	}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
