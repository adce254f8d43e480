package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// batchRecorder is a beforeCommit hook that records the size of every
// committed batch and holds the first transaction open until released, so
// that the calls made meanwhile queue.
type batchRecorder struct {
	mu      sync.Mutex
	sizes   []int
	entered chan struct{} // closed when the first transaction is in the hook
	release chan struct{} // closed by the test to let it commit
	// then, if set, runs in every later transaction before its COMMIT.
	then func(tx *sql.Tx, calls int)
}

func newBatchRecorder(db *DB) *batchRecorder {
	r := &batchRecorder{entered: make(chan struct{}), release: make(chan struct{})}
	db.beforeCommit = r.hook
	return r
}

func (r *batchRecorder) hook(tx *sql.Tx, calls int) {
	r.mu.Lock()
	r.sizes = append(r.sizes, calls)
	first := len(r.sizes) == 1
	r.mu.Unlock()
	if first {
		close(r.entered)
		<-r.release
		return
	}
	if r.then != nil {
		r.then(tx, calls)
	}
}

func (r *batchRecorder) batches() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sizes)
}

// waitQueued waits until n CompleteJoin and RecordRenewal calls wait in
// db's queue.
func waitQueued(t *testing.T, db *DB, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		db.queue.mu.Lock()
		got := len(db.queue.calls)
		db.queue.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// auditSubjects counts the audit events by subject.
func auditSubjects(t *testing.T, db *DB) map[string]int {
	t.Helper()
	es, err := db.ListAudit(t.Context(), 10000)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, e := range es {
		m[e.Subject]++
	}
	return m
}

// withAudit is j with an audit event naming its node.
func withAudit(j store.Join) store.Join {
	j.Audit = &store.AuditEvent{Time: j.Now, Actor: "join", Action: "join", Subject: j.Node.ID, Detail: "serial " + j.Cert.Serial}
	return j
}

// 64 concurrent joins, some of them conflicting, share one transaction:
// each caller gets its own result, and the store holds exactly the joins
// that were told they succeeded, with their audit events.
func TestConcurrentJoinsShareATransactionAndEachGetsItsResult(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range 64 {
		if err := db.CreateToken(ctx, testToken(fmt.Sprintf("tok%02d", i), now)); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.CreateToken(ctx, testToken("spent", now)); err != nil {
		t.Fatal(err)
	}
	if err := db.CompleteJoin(ctx, testJoin(hash("spent"), "node-spent", "s-spent", now)); err != nil {
		t.Fatal(err)
	}

	// Joins 0-39 have their own token and node. Joins 40-47 reuse the
	// tokens of joins 32-39; 48-55 use a spent token; 56-63 have their
	// own token but the node ids of joins 0-7, so one of each pair wins
	// and the loser's token must stay unspent.
	const n = 64
	joins := make([]store.Join, n)
	for i := range n {
		tok, node := fmt.Sprintf("tok%02d", i), fmt.Sprintf("node-%02d", i)
		switch {
		case i >= 40 && i < 48:
			tok = fmt.Sprintf("tok%02d", i-8)
		case i >= 48 && i < 56:
			tok = "spent"
		case i >= 56:
			node = fmt.Sprintf("node-%02d", i-56)
		}
		joins[i] = withAudit(testJoin(hash(tok), node, fmt.Sprintf("s%02d", i), now.Add(time.Minute)))
	}

	rec := newBatchRecorder(db)
	errs := make([]error, n)
	var wg sync.WaitGroup
	// Join 0 runs alone and holds its transaction until the 63 others
	// wait; they then share the next one.
	wg.Go(func() { errs[0] = db.CompleteJoin(ctx, joins[0]) })
	<-rec.entered
	for i := 1; i < n; i++ {
		wg.Go(func() { errs[i] = db.CompleteJoin(ctx, joins[i]) })
	}
	waitQueued(t, db, n-1)
	close(rec.release)
	wg.Wait()

	if got := rec.batches(); !slices.Equal(got, []int{1, n - 1}) {
		t.Errorf("batches of %v calls, want [1 %d]", got, n-1)
	}
	won := func(i int) bool { return errs[i] == nil }
	for i, err := range errs {
		if err != nil && !errors.Is(err, store.ErrConflict) {
			t.Errorf("join %d: %v, want success or a conflict", i, err)
		}
	}
	for i := range 40 {
		if i < 8 || i >= 32 {
			continue // in a pair, checked below
		}
		if !won(i) {
			t.Errorf("join %d with its own token and node failed: %v", i, errs[i])
		}
	}
	for i := 48; i < 56; i++ {
		if won(i) {
			t.Errorf("join %d with a spent token succeeded", i)
		}
	}
	for _, p := range [][2]int{{0, 56}, {1, 57}, {2, 58}, {3, 59}, {4, 60}, {5, 61}, {6, 62}, {7, 63},
		{32, 40}, {33, 41}, {34, 42}, {35, 43}, {36, 44}, {37, 45}, {38, 46}, {39, 47}} {
		if won(p[0]) == won(p[1]) {
			t.Errorf("joins %d and %d: %v and %v; want exactly one to succeed", p[0], p[1], errs[p[0]], errs[p[1]])
		}
	}
	if won(0) != true {
		t.Errorf("join 0, committed before join 56 ran, failed: %v", errs[0])
	}

	// The store holds exactly the winners.
	audits := auditSubjects(t, db)
	for i, j := range joins {
		c, err := db.GetCert(ctx, j.Cert.Serial)
		switch {
		case won(i) && err != nil:
			t.Errorf("certificate of successful join %d: %v", i, err)
		case !won(i) && !errors.Is(err, store.ErrNotFound):
			t.Errorf("certificate of refused join %d: %+v, %v; want none", i, c, err)
		}
		if won(i) {
			if n, err := db.GetNode(ctx, j.Node.ID); err != nil || n.CertSerial != j.Cert.Serial {
				t.Errorf("node of successful join %d: %+v, %v", i, n, err)
			}
			if tok, err := db.TokenByHash(ctx, j.TokenHash); err != nil || tok.UsedBy != j.Node.ID {
				t.Errorf("token of successful join %d used by %q (%v), want %s", i, tok.UsedBy, err, j.Node.ID)
			}
			if audits[j.Node.ID] != 1 {
				t.Errorf("%d audit events of %s, want 1", audits[j.Node.ID], j.Node.ID)
			}
		}
	}
	// The losers of the node-id pairs left their own tokens unspent.
	for i := 56; i < n; i++ {
		if !won(i) {
			if tok, err := db.TokenByHash(ctx, joins[i].TokenHash); err != nil || !tok.UsedAt.IsZero() {
				t.Errorf("token of refused join %d: %+v, %v; want it unspent", i, tok, err)
			}
		}
	}
	es, err := db.ListAudit(ctx, 10000)
	if err != nil {
		t.Fatal(err)
	}
	winners := 0
	for i := range n {
		if won(i) {
			winners++
		}
	}
	if len(es) != winners {
		t.Errorf("%d audit events, want one per successful join (%d)", len(es), winners)
	}
}

// A COMMIT that fails fails every join of its transaction, a join that
// would have been refused included, and leaves the store usable.
func TestACommitFailureIsReportedToEveryJoinOfTheBatch(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const n = 16
	for i := range n + 1 {
		if err := db.CreateToken(ctx, testToken(fmt.Sprintf("tok%02d", i), now)); err != nil {
			t.Fatal(err)
		}
	}
	rec := newBatchRecorder(db)
	// In the second transaction, a row that breaks a deferred foreign key:
	// SQLite checks it, and fails, at COMMIT.
	rec.then = func(tx *sql.Tx, calls int) {
		if _, err := tx.Exec(`PRAGMA defer_foreign_keys = ON`); err != nil {
			t.Error(err)
		}
		if _, err := tx.Exec(`INSERT INTO node_serials (node_id, pos, serial) VALUES ('ghost', 0, 'x')`); err != nil {
			t.Error(err)
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = db.CompleteJoin(ctx, withAudit(testJoin(hash("tok00"), "node-00", "s00", now))) })
	<-rec.entered
	for i := 1; i < n; i++ {
		tok := fmt.Sprintf("tok%02d", i)
		if i == n-1 {
			tok = "tok01" // refused after join 1, which will not commit either
		}
		j := withAudit(testJoin(hash(tok), fmt.Sprintf("node-%02d", i), fmt.Sprintf("s%02d", i), now))
		wg.Go(func() { errs[i] = db.CompleteJoin(ctx, j) })
	}
	waitQueued(t, db, n-1)
	close(rec.release)
	wg.Wait()

	if got := rec.batches(); !slices.Equal(got, []int{1, n - 1}) {
		t.Fatalf("batches of %v calls, want [1 %d]", got, n-1)
	}
	if errs[0] != nil {
		t.Errorf("join 0, alone in the first transaction: %v", errs[0])
	}
	for i := 1; i < n; i++ {
		if errs[i] == nil || !strings.Contains(errs[i].Error(), "commit") || errors.Is(errs[i], store.ErrConflict) {
			t.Errorf("join %d in the failed transaction: %v, want the COMMIT's error", i, errs[i])
		}
	}
	audits := auditSubjects(t, db)
	for i := 1; i < n; i++ {
		id := fmt.Sprintf("node-%02d", i)
		if _, err := db.GetNode(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("node of failed join %d: %v, want none", i, err)
		}
		if tok, err := db.TokenByHash(ctx, hash(fmt.Sprintf("tok%02d", i))); err != nil || !tok.UsedAt.IsZero() {
			t.Errorf("token of failed join %d: %+v, %v; want it unspent", i, tok, err)
		}
		if audits[id] != 0 {
			t.Errorf("%d audit events of failed join %d", audits[id], i)
		}
	}
	// The writer is out of the failed transaction: the next join commits.
	rec.then = nil
	if err := db.CompleteJoin(ctx, testJoin(hash("tok01"), "node-01", "s01", now)); err != nil {
		t.Errorf("join after the failed COMMIT: %v", err)
	}
	if err := db.CompleteJoin(ctx, testJoin(hash(fmt.Sprintf("tok%02d", n)), "node-99", "s99", now)); err != nil {
		t.Errorf("second join after the failed COMMIT: %v", err)
	}
}

// The calls queued behind a transaction, joins and renewals, run in
// batches of at most maxBatch.
func TestBatchesAreBounded(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const queued = maxBatch + 72
	rec := newBatchRecorder(db)
	errs := make([]error, queued+1)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = db.CompleteJoin(ctx, testJoin(nil, "node-0000", "s0000", now)) })
	<-rec.entered
	joins := 1
	for i := 1; i <= queued; i++ {
		if i%2 == 1 {
			wg.Go(func() {
				errs[i] = db.CompleteJoin(ctx, testJoin(nil, fmt.Sprintf("node-%04d", i), fmt.Sprintf("s%04d", i), now))
			})
			joins++
			continue
		}
		wg.Go(func() {
			errs[i] = db.RecordRenewal(ctx, testRenewal("node-0000", fmt.Sprintf("r%04d", i), 1, now.Add(time.Duration(i)*time.Second)), nil)
		})
	}
	waitQueued(t, db, queued)
	close(rec.release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if got := rec.batches(); !slices.Equal(got, []int{1, maxBatch, 72}) {
		t.Errorf("batches of %v calls, want [1 %d 72]", got, maxBatch)
	}
	if ns, err := db.ListNodes(ctx); err != nil || len(ns) != joins {
		t.Errorf("ListNodes: %d nodes, %v; want %d", len(ns), err, joins)
	}
	if n, err := db.CountCerts(ctx, "node-0000", time.Time{}); err != nil || n != queued/2+1 {
		t.Errorf("CountCerts(node-0000) = %d, %v; want %d", n, err, queued/2+1)
	}
}

// A join or a renewal that finds no transaction running runs at once,
// alone.
func TestALoneCallRunsAlone(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var sizes []int
	db.beforeCommit = func(_ *sql.Tx, calls int) { sizes = append(sizes, calls) }
	for i := range 5 {
		if err := db.CompleteJoin(t.Context(), testJoin(nil, fmt.Sprintf("node-%d", i), fmt.Sprintf("s%d", i), now)); err != nil {
			t.Fatal(err)
		}
		if err := db.RecordRenewal(t.Context(), testRenewal(fmt.Sprintf("node-%d", i), fmt.Sprintf("r%d", i), 1, now), nil); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(sizes, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
		t.Errorf("batches of %v calls, want ten of 1", sizes)
	}
}

// A call whose context ends while it waits in the queue returns at once
// and its join is not written; the other calls are not disturbed.
func TestAQueuedJoinWhoseContextEndsLeavesTheQueue(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := newBatchRecorder(db)
	var first, third error
	var wg sync.WaitGroup
	wg.Go(func() { first = db.CompleteJoin(t.Context(), testJoin(nil, "node-1", "s1", now)) })
	<-rec.entered

	ctx, cancel := context.WithCancel(t.Context())
	second := make(chan error, 1)
	go func() { second <- db.CompleteJoin(ctx, withAudit(testJoin(nil, "node-2", "s2", now))) }()
	waitQueued(t, db, 1)
	wg.Go(func() { third = db.CompleteJoin(t.Context(), testJoin(nil, "node-3", "s3", now)) })
	waitQueued(t, db, 2)
	cancel()
	select {
	case err := <-second:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled queued join: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled join waits for the running transaction")
	}
	waitQueued(t, db, 1)
	close(rec.release)
	wg.Wait()
	if first != nil || third != nil {
		t.Errorf("the other joins: %v, %v", first, third)
	}
	if _, err := db.GetNode(t.Context(), "node-2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node of the cancelled join: %v, want none", err)
	}
	if audits := auditSubjects(t, db); audits["node-2"] != 0 {
		t.Error("the cancelled join's audit event was written")
	}
}

// An audit event whose time cannot be stored refuses the call, which
// writes nothing.
func TestAnAuditEventOutsideTheStorableRangeRefusesTheCall(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	bad := &store.AuditEvent{Time: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), Action: "x"}
	j := testJoin(nil, "node-1", "s1", now)
	j.Audit = bad
	if err := db.CompleteJoin(ctx, j); err == nil || !strings.Contains(err.Error(), "storable range") {
		t.Errorf("CompleteJoin: %v, want a range error", err)
	}
	if _, err := db.GetNode(ctx, "node-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node of the refused join: %v", err)
	}
	if err := db.CompleteJoin(ctx, testJoin(nil, "node-1", "s1", now)); err != nil {
		t.Fatal(err)
	}
	if err := db.RecordRenewal(ctx, store.Cert{Serial: "s2", NodeID: "node-1", Generation: 1, Kind: "renew", IssuedAt: now}, bad); err == nil {
		t.Error("RecordRenewal succeeded")
	}
	if _, _, err := db.RevokeNode(ctx, "node-1", "test", now, bad); err == nil {
		t.Error("RevokeNode succeeded")
	}
	if _, _, err := db.DeleteNode(ctx, "node-1", "test", now, bad); err == nil {
		t.Error("DeleteNode succeeded")
	}
	if n, err := db.GetNode(ctx, "node-1"); err != nil || n.Generation != 1 || n.CertSerial != "s1" {
		t.Errorf("node after the refused calls: %+v, %v", n, err)
	}
	if es, err := db.ListAudit(ctx, 10); err != nil || len(es) != 0 {
		t.Errorf("audit trail: %v, %v; want none", es, err)
	}
}

// Open prepares every registered statement; Close closes them.
func TestOpenPreparesEveryStatement(t *testing.T) {
	db := openTemp(t)
	if len(db.reads) != len(readSQL) || len(db.writes) != len(writeSQL) {
		t.Fatalf("%d reader and %d writer statements prepared, want %d and %d",
			len(db.reads), len(db.writes), len(readSQL), len(writeSQL))
	}
	for _, s := range slices.Concat(db.reads, db.writes) {
		if s == nil {
			t.Fatal("a statement is not prepared")
		}
	}
	mustClose(t, db)
	for _, s := range slices.Concat(db.reads, db.writes) {
		if _, err := s.Exec(); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("a statement runs after Close: %v", err)
		}
	}
}

// BenchmarkApplyInventory1000 writes 1,000 new declarations with ten
// changelog entries each in one ApplyInventory transaction.
func BenchmarkApplyInventory1000(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		db := openTemp(b)
		w := store.InventoryWrite{}
		now := time.Now()
		for i := range 1000 {
			name := fmt.Sprintf("node-%04d", i)
			w.Writes = append(w.Writes, store.DeclarationWrite{Declaration: store.Declaration{Name: name, Serial: "SN" + name,
				ProductUUID: "uuid-" + name, Class: "worker", Site: "rack1", EKPins: []string{"sha256:" + name}, EKSource: "supplier-record", UpdatedAt: now}})
			for f := range 10 {
				w.Changes = append(w.Changes, store.FieldChange{Time: now, Device: name, Field: fmt.Sprint("f", f), New: "v", Actor: "alice", ActorRole: "declarer", RequestID: "r"})
			}
		}
		b.StartTimer()
		if err := db.ApplyInventory(context.Background(), w); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		db.Close()
		b.StartTimer()
	}
}
