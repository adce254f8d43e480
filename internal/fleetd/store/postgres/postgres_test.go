package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/postgres/pgtest"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestConformance(t *testing.T) {
	c := pgtest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		db, err := Open(t.Context(), c.NewSchema(t), Options{})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return db
	})
}

func open(t *testing.T, dsn string) *DB {
	t.Helper()
	db, err := Open(t.Context(), dsn, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestReplicasStartingTogetherMigrateOnce(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	const n = 8
	dbs := make([]*DB, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			dbs[i], errs[i] = Open(t.Context(), dsn, Options{})
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: Open: %v", i, err)
		}
		defer dbs[i].Close()
	}
	var versions, rows int
	if err := dbs[0].pool.QueryRow(t.Context(), `SELECT count(DISTINCT version), count(*) FROM schema_migrations`).Scan(&versions, &rows); err != nil {
		t.Fatal(err)
	}
	if versions != len(migrations) || rows != len(migrations) {
		t.Errorf("schema_migrations has %d rows of %d versions, want each of the %d migrations once", rows, versions, len(migrations))
	}
}

func TestANewerSchemaIsRefused(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	db := open(t, dsn)
	if _, err := db.pool.Exec(t.Context(), `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, now())`, len(migrations)+1); err != nil {
		t.Fatal(err)
	}
	_, err := Open(t.Context(), dsn, Options{})
	if err == nil || !strings.Contains(err.Error(), "newer than this fleetd knows") {
		t.Fatalf("Open of a newer schema: %v, want a refusal naming the versions", err)
	}
}

func TestRedactAndPassword(t *testing.T) {
	for _, tc := range []struct {
		dsn  string
		pass bool
	}{
		{"postgres://fleetd@db:5432/fleetd", false},
		{"postgres://fleetd:s3cret@db:5432/fleetd", true},
		{"postgres://fleetd@db/fleetd?password=s3cret&sslmode=verify-full", true},
	} {
		if got := HasPassword(tc.dsn); got != tc.pass {
			t.Errorf("HasPassword(%q) = %t", tc.dsn, got)
		}
		if r := Redact(tc.dsn); strings.Contains(r, "s3cret") {
			t.Errorf("Redact(%q) = %q, still has the password", tc.dsn, r)
		}
	}
}

// TestRevocationsReachEveryWatcher revokes through one store and sees the
// revocation arrive at the watch of another store on the same database.
func TestRevocationsReachEveryWatcher(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	got := watch(t, b)
	mustJoin(t, a, "node-1", "s1")
	g, _, err := a.RevokeNode(t.Context(), "node-1", "disk stolen", time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := next(t, got)
	if r.NodeID != "node-1" || r.Generation != g || r.Reason != "disk stolen" {
		t.Fatalf("watcher got %+v, want node-1 at generation %d, reason disk stolen", r, g)
	}
	if _, _, err := a.DeleteNode(t.Context(), "node-1", "gone", time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	if r := next(t, got); r.NodeID != "node-1" || r.Generation != g+1 || r.Reason != "gone" {
		t.Fatalf("watcher got %+v for the deletion", r)
	}
}

// TestAReclaimReachesEveryWatcher reclaims a node through one store: the
// watch of another store hears a revocation at the reclaiming node's
// generation, which ends the old identity's session wherever it is held.
func TestAReclaimReachesEveryWatcher(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	got := watch(t, b)
	mustJoin(t, a, "node-1", "s1")
	now := time.Now()
	n, err := a.GetNode(t.Context(), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	n.Generation, n.CertSerial = 2, "s2"
	err = a.CompleteJoin(t.Context(), store.Join{Now: now, Reclaim: true, Node: n,
		Cert: store.Cert{Serial: "s2", NodeID: "node-1", Generation: 2, Kind: "join", IssuedAt: now, NotAfter: now.Add(time.Hour)}})
	if err != nil {
		t.Fatalf("reclaim: %v", err)
	}
	if r := next(t, got); r.NodeID != "node-1" || r.Generation != 2 || r.Reason != "reclaimed" {
		t.Fatalf("watcher got %+v, want node-1 reclaimed at generation 2", r)
	}
}

// TestRevocationsMadeWhileTheListenerIsDownArrive kills the watcher's
// connection (as a database blip would), revokes while it is down, and
// expects the catch-up read to deliver the revocation.
func TestRevocationsMadeWhileTheListenerIsDownArrive(t *testing.T) {
	c := pgtest.StartOwn(t)
	dsn := c.NewDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	lost := make(chan error, 16)
	got := watchWith(t, b, func(err error) { lost <- err })
	mustJoin(t, a, "node-1", "s1")

	// Stop the server: the listener loses its connection; revoke as soon
	// as the database is back, before the listener has reconnected (its
	// backoff) — or after, either way the revocation must arrive.
	c.Stop(t)
	select {
	case err := <-lost:
		if err == nil || !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("the listener reported %v, want a loss wrapping store.ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the listener did not notice the server stopped")
	}
	c.Restart(t)
	var err error
	for range 100 {
		if _, _, err = a.RevokeNode(t.Context(), "node-1", "during the blip", time.Now(), nil); !errors.Is(err, store.ErrUnavailable) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the pool reconnects
	}
	if err != nil {
		t.Fatalf("RevokeNode after the restart: %v", err)
	}
	for {
		r := next(t, got)
		if r.NodeID == "node-1" {
			if r.Reason != "during the blip" {
				t.Fatalf("got %+v", r)
			}
			return
		}
	}
}

func TestAnUnreachableDatabaseIsUnavailable(t *testing.T) {
	c := pgtest.StartOwn(t)
	db := open(t, c.NewDatabase(t))
	mustJoin(t, db, "node-1", "s1")
	c.Stop(t)
	_, err := db.GetNode(t.Context(), "node-1")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("GetNode with the server stopped: %v, want store.ErrUnavailable", err)
	}
	err = db.RecordRenewal(t.Context(), store.Cert{Serial: "r1", NodeID: "node-1", Generation: 1, Kind: "renew", IssuedAt: time.Now(), NotAfter: time.Now().Add(time.Hour)}, nil)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("RecordRenewal with the server stopped: %v, want store.ErrUnavailable", err)
	}
	c.Restart(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = db.GetNode(t.Context(), "node-1")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store did not come back after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func watch(t *testing.T, db *DB) <-chan store.Revocation {
	t.Helper()
	return watchWith(t, db, nil)
}

// watchWith starts db's watch and returns once it delivers: a probe
// revocation of a throwaway node has arrived.
func watchWith(t *testing.T, db *DB, state func(error)) <-chan store.Revocation {
	t.Helper()
	got := make(chan store.Revocation, 16)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = db.WatchRevocations(ctx, func(r store.Revocation) { got <- r }, state)
	}()
	t.Cleanup(func() { cancel(); <-done })
	mustJoin(t, db, "probe", "probe-serial")
	for range 300 {
		if _, _, err := db.RevokeNode(t.Context(), "probe", "probe", time.Now(), nil); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
			return got
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatal("the watch delivered no revocation within a minute")
	return nil
}

func next(t *testing.T, c <-chan store.Revocation) store.Revocation {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case r := <-c:
			if r.NodeID == "probe" {
				// A late answer to one of watchWith's probes.
				continue
			}
			return r
		case <-deadline:
			t.Fatal("no revocation arrived within 60s")
			return store.Revocation{}
		}
	}
}

func mustJoin(t *testing.T, db *DB, id, serial string) {
	t.Helper()
	now := time.Now()
	err := db.CompleteJoin(t.Context(), store.Join{
		Now:  now,
		Node: store.Node{ID: id, State: store.StateActive, Generation: 1, JoinedAt: now, CertSerial: serial},
		Cert: store.Cert{Serial: serial, NodeID: id, Generation: 1, Kind: "join", IssuedAt: now, NotAfter: now.Add(time.Hour)},
	})
	if err != nil {
		t.Fatalf("join %s: %v", id, err)
	}
}

// TestRenewalLimitAcrossReplicas races renewals of one node through two
// stores on one database, as two replicas would: the limit holds.
func TestRenewalLimitAcrossReplicas(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	storetest.RenewalLimitRace(t, open(t, dsn), open(t, dsn))
}
