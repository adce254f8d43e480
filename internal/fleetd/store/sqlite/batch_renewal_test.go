package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// testRenewal is a renewal of node id at gen with serial, issued at issued
// and valid for a day.
func testRenewal(id, serial string, gen uint64, issued time.Time) store.Cert {
	return store.Cert{Serial: serial, NodeID: id, Generation: gen, Kind: "renew",
		IssuedAt: issued, NotAfter: issued.Add(24 * time.Hour)}
}

// renewalAudit is the audit event of a renewal, with its own subject.
func renewalAudit(subject string, when time.Time) *store.AuditEvent {
	return &store.AuditEvent{Time: when, Actor: "renew", Action: "renew", Subject: subject}
}

// renewed is n after the renewal c.
func renewed(n store.Node, c store.Cert) store.Node {
	n.CertSerial, n.CertNotAfter, n.LastSeen = c.Serial, c.NotAfter, c.IssuedAt
	return n
}

// 64 concurrent renewals, some of them conflicting, mixed with 16 joins,
// share one transaction: each caller gets its own result, and the store
// holds exactly the renewals and joins that were told they succeeded,
// with their audit events.
func TestConcurrentRenewalsAndJoinsShareATransactionAndEachGetsItsResult(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const nr, nj = 64, 16
	before := make([]store.Node, nr)
	for i := range nr {
		j := testJoin(nil, fmt.Sprintf("node-%02d", i), fmt.Sprintf("j%02d", i), now)
		if err := db.CompleteJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
		before[i] = j.Node
	}
	for k := range nj {
		if err := db.CreateToken(ctx, testToken(fmt.Sprintf("tok%02d", k), now)); err != nil {
			t.Fatal(err)
		}
	}

	// Renewal i renews node-i, and no other call changes that node.
	// Renewals 0-31 are valid, but 28-31 share their serials with joins
	// 8-11, so one of each pair wins; 32-39 are at the wrong generation;
	// 40-43 reuse the committed serials of the joins of nodes 0-3; 44-47
	// renew unknown nodes; 48-55 and 56-63 are pairs sharing a serial.
	renewals := make([]store.Cert, nr)
	audits := make([]*store.AuditEvent, nr)
	for i := range nr {
		id, serial, gen := fmt.Sprintf("node-%02d", i), fmt.Sprintf("r%02d", i), uint64(1)
		switch {
		case i >= 32 && i < 40:
			gen = 2
		case i >= 40 && i < 44:
			serial = fmt.Sprintf("j%02d", i-40)
		case i >= 44 && i < 48:
			id = fmt.Sprintf("ghost-%02d", i)
		case i >= 48 && i < 56:
			serial = fmt.Sprintf("d%02d", i)
		case i >= 56:
			serial = fmt.Sprintf("d%02d", i-8)
		}
		issued := now.Add(time.Hour + time.Duration(i)*time.Second)
		renewals[i] = testRenewal(id, serial, gen, issued)
		audits[i] = renewalAudit(fmt.Sprintf("renewal-%02d", i), issued)
	}
	// Joins 0-7 are valid; 8-11 take the serials of renewals 28-31; 12-15
	// claim the ids of nodes 0-3 without reclaiming them.
	joins := make([]store.Join, nj)
	for k := range nj {
		id, serial := fmt.Sprintf("new-%02d", k), fmt.Sprintf("n%02d", k)
		switch {
		case k >= 8 && k < 12:
			serial = fmt.Sprintf("r%02d", k+20)
		case k >= 12:
			id = fmt.Sprintf("node-%02d", k-12)
		}
		j := testJoin(hash(fmt.Sprintf("tok%02d", k)), id, serial, now.Add(30*time.Minute))
		j.Audit = &store.AuditEvent{Time: j.Now, Actor: "join", Action: "join", Subject: fmt.Sprintf("join-%02d", k)}
		joins[k] = j
	}

	rec := newBatchRecorder(db)
	rerrs, jerrs := make([]error, nr), make([]error, nj)
	var wg sync.WaitGroup
	// Renewal 0 runs alone and holds its transaction until the 79 other
	// calls wait; they then share the next one, in the order they came.
	wg.Go(func() { rerrs[0] = db.RecordRenewal(ctx, renewals[0], audits[0]) })
	<-rec.entered
	for i := 1; i < nr; i++ {
		wg.Go(func() { rerrs[i] = db.RecordRenewal(ctx, renewals[i], audits[i]) })
		if k := i / 4; i%4 == 0 && k < nj {
			wg.Go(func() { jerrs[k] = db.CompleteJoin(ctx, joins[k]) })
		}
	}
	wg.Go(func() { jerrs[0] = db.CompleteJoin(ctx, joins[0]) })
	waitQueued(t, db, nr-1+nj)
	close(rec.release)
	wg.Wait()

	if got := rec.batches(); !slices.Equal(got, []int{1, nr - 1 + nj}) {
		t.Errorf("batches of %v calls, want [1 %d]", got, nr-1+nj)
	}
	rwon := func(i int) bool { return rerrs[i] == nil }
	jwon := func(k int) bool { return jerrs[k] == nil }
	for i, err := range rerrs {
		if err != nil && !errors.Is(err, store.ErrConflict) {
			t.Errorf("renewal %d: %v, want success or a conflict", i, err)
		}
	}
	for k, err := range jerrs {
		if err != nil && !errors.Is(err, store.ErrConflict) {
			t.Errorf("join %d: %v, want success or a conflict", k, err)
		}
	}
	for i := range 28 {
		if !rwon(i) {
			t.Errorf("valid renewal %d failed: %v", i, rerrs[i])
		}
	}
	for i := 32; i < 48; i++ {
		if rwon(i) {
			t.Errorf("renewal %d (%+v) succeeded, want a conflict", i, renewals[i])
		}
	}
	for i := 32; i < 40; i++ {
		if rerrs[i] != nil && !strings.Contains(rerrs[i].Error(), "generation 1, certificate has 2") {
			t.Errorf("renewal %d at the wrong generation: %v", i, rerrs[i])
		}
	}
	for i := 44; i < 48; i++ {
		if rerrs[i] != nil && !strings.Contains(rerrs[i].Error(), "node is gone") {
			t.Errorf("renewal %d of an unknown node: %v", i, rerrs[i])
		}
	}
	for k := range 8 {
		if !jwon(k) {
			t.Errorf("valid join %d failed: %v", k, jerrs[k])
		}
	}
	for k := 12; k < nj; k++ {
		if jwon(k) {
			t.Errorf("join %d of an existing node id succeeded", k)
		}
	}
	for i := 48; i < 56; i++ {
		if rwon(i) == rwon(i+8) {
			t.Errorf("renewals %d and %d sharing a serial: %v and %v; want exactly one to succeed", i, i+8, rerrs[i], rerrs[i+8])
		}
	}
	for k := 8; k < 12; k++ {
		if rwon(k+20) == jwon(k) {
			t.Errorf("renewal %d and join %d sharing a serial: %v and %v; want exactly one to succeed", k+20, k, rerrs[k+20], jerrs[k])
		}
	}

	// The store holds exactly the winners: every node has its renewal if
	// it won, every serial the certificate of the call that took it.
	want := map[string]store.Cert{} // by serial
	for i := range nr {
		want[fmt.Sprintf("j%02d", i)] = testJoin(nil, fmt.Sprintf("node-%02d", i), fmt.Sprintf("j%02d", i), now).Cert
	}
	for i, c := range renewals {
		if _, ok := want[c.Serial]; !ok {
			want[c.Serial] = store.Cert{} // none, unless a winner took it
		}
		n := before[i]
		if rwon(i) {
			want[c.Serial] = c
			n = renewed(n, c)
		}
		if got, err := db.GetNode(ctx, fmt.Sprintf("node-%02d", i)); err != nil || !reflect.DeepEqual(got, n) {
			t.Errorf("node of renewal %d (%v):\n got  %+v, %v\n want %+v", i, rerrs[i], got, err, n)
		}
	}
	for k, j := range joins {
		if _, ok := want[j.Cert.Serial]; !ok {
			want[j.Cert.Serial] = store.Cert{}
		}
		if jwon(k) {
			want[j.Cert.Serial] = j.Cert
			if n, err := db.GetNode(ctx, j.Node.ID); err != nil || !reflect.DeepEqual(n, j.Node) {
				t.Errorf("node of successful join %d: %+v, %v", k, n, err)
			}
		} else if k < 12 {
			if _, err := db.GetNode(ctx, j.Node.ID); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("node of refused join %d: %v, want none", k, err)
			}
		}
		tok, err := db.TokenByHash(ctx, j.TokenHash)
		switch {
		case err != nil:
			t.Errorf("token of join %d: %v", k, err)
		case jwon(k) && tok.UsedBy != j.Node.ID:
			t.Errorf("token of successful join %d used by %q, want %s", k, tok.UsedBy, j.Node.ID)
		case !jwon(k) && !tok.UsedAt.IsZero():
			t.Errorf("token of refused join %d spent: %+v", k, tok)
		}
	}
	for serial, c := range want {
		got, err := db.GetCert(ctx, serial)
		switch {
		case c.Serial == "" && !errors.Is(err, store.ErrNotFound):
			t.Errorf("certificate %s that no call took: %+v, %v; want none", serial, got, err)
		case c.Serial != "" && (err != nil || !reflect.DeepEqual(got, c)):
			t.Errorf("certificate %s:\n got  %+v, %v\n want %+v", serial, got, err, c)
		}
	}
	subjects := auditSubjects(t, db)
	winners := 0
	wantEvents := func(what string, subject string, won bool, err error) {
		want := 0
		if won {
			want = 1
			winners++
		}
		if subjects[subject] != want {
			t.Errorf("%d audit events of %s (%v), want %d", subjects[subject], what, err, want)
		}
	}
	for i := range nr {
		wantEvents(fmt.Sprintf("renewal %d", i), audits[i].Subject, rwon(i), rerrs[i])
	}
	for k, j := range joins {
		wantEvents(fmt.Sprintf("join %d", k), j.Audit.Subject, jwon(k), jerrs[k])
	}
	if es, err := db.ListAudit(ctx, 10000); err != nil || len(es) != winners {
		t.Errorf("%d audit events (%v), want one per successful call (%d)", len(es), err, winners)
	}
}

// A batch is its calls run one after the other, in the order they queued:
// a renewal sees a join, a reclaim, or a serial taken earlier in its batch.
func TestABatchRunsItsCallsInQueueOrder(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := db.CompleteJoin(ctx, testJoin(nil, "node-a", "a1", now)); err != nil {
		t.Fatal(err)
	}
	reclaim := testJoin(nil, "node-a", "a3", now.Add(3*time.Minute))
	reclaim.Reclaim, reclaim.Node.Generation, reclaim.Cert.Generation = true, 2, 2
	at := func(m int) time.Time { return now.Add(time.Duration(m) * time.Minute) }
	calls := []struct {
		name string
		run  func() error
		// conflict says the call is refused with ErrConflict and this
		// text; "" that it succeeds.
		conflict string
	}{
		{"join of node-b", func() error { return db.CompleteJoin(ctx, testJoin(nil, "node-b", "b1", at(1))) }, ""},
		{"renewal of node-b, joined in the batch", func() error {
			return db.RecordRenewal(ctx, testRenewal("node-b", "b2", 1, at(2)), nil)
		}, ""},
		{"reclaim of node-a", func() error { return db.CompleteJoin(ctx, reclaim) }, ""},
		{"renewal of node-a at the generation the reclaim ended", func() error {
			return db.RecordRenewal(ctx, testRenewal("node-a", "a4", 1, at(4)), nil)
		}, "node is at generation 2, certificate has 1"},
		{"renewal of node-a at its new generation", func() error {
			return db.RecordRenewal(ctx, testRenewal("node-a", "a5", 2, at(5)), nil)
		}, ""},
		{"renewal reusing a serial of the batch", func() error {
			return db.RecordRenewal(ctx, testRenewal("node-b", "b2", 1, at(6)), nil)
		}, "certificate b2 exists"},
		{"join reusing a serial of the batch", func() error {
			return db.CompleteJoin(ctx, testJoin(nil, "node-c", "a5", at(7)))
		}, "certificate a5 exists"},
	}

	rec := newBatchRecorder(db)
	var first error
	var wg sync.WaitGroup
	wg.Go(func() { first = db.RecordRenewal(ctx, testRenewal("node-a", "a2", 1, now), nil) })
	<-rec.entered
	errs := make([]error, len(calls))
	for i, c := range calls {
		wg.Go(func() { errs[i] = c.run() })
		waitQueued(t, db, i+1)
	}
	close(rec.release)
	wg.Wait()
	if got := rec.batches(); !slices.Equal(got, []int{1, len(calls)}) {
		t.Errorf("batches of %v calls, want [1 %d]", got, len(calls))
	}
	if first != nil {
		t.Errorf("first renewal: %v", first)
	}
	for i, c := range calls {
		switch {
		case c.conflict == "" && errs[i] != nil:
			t.Errorf("%s: %v", c.name, errs[i])
		case c.conflict != "" && (!errors.Is(errs[i], store.ErrConflict) || !strings.Contains(fmt.Sprint(errs[i]), c.conflict)):
			t.Errorf("%s: %v, want a conflict: %s", c.name, errs[i], c.conflict)
		}
	}
	if n, err := db.GetNode(ctx, "node-a"); err != nil || n.Generation != 2 || n.CertSerial != "a5" || !n.LastSeen.Equal(at(5)) {
		t.Errorf("node-a: %+v, %v; want generation 2, serial a5", n, err)
	}
	if n, err := db.GetNode(ctx, "node-b"); err != nil || n.CertSerial != "b2" || !n.LastSeen.Equal(at(2)) {
		t.Errorf("node-b: %+v, %v; want serial b2", n, err)
	}
	if _, err := db.GetNode(ctx, "node-c"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node-c: %v, want none", err)
	}
	for serial, want := range map[string]string{"a1": "reclaimed", "a2": "reclaimed", "a3": "", "a5": "", "b1": "", "b2": ""} {
		if c, err := db.GetCert(ctx, serial); err != nil || c.RevokedReason != want {
			t.Errorf("certificate %s: %+v, %v; want revoked reason %q", serial, c, err, want)
		}
	}
	if c, err := db.GetCert(ctx, "b2"); err != nil || !c.IssuedAt.Equal(at(2)) {
		t.Errorf("certificate b2: %+v, %v; want the first renewal's", c, err)
	}
	if _, err := db.GetCert(ctx, "a4"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("certificate of the refused renewal: %v, want none", err)
	}
}

// A COMMIT that fails fails every renewal and join of its transaction,
// those that would have been refused included, and leaves the store
// usable.
func TestACommitFailureIsReportedToEveryCallOfAMixedBatch(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const n = 8
	before := make([]store.Node, n)
	for i := range n {
		j := testJoin(nil, fmt.Sprintf("node-%02d", i), fmt.Sprintf("j%02d", i), now)
		if err := db.CompleteJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
		before[i] = j.Node
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
	first := testRenewal("node-00", "r00", 1, now.Add(time.Hour))
	var firstErr error
	var wg sync.WaitGroup
	wg.Go(func() { firstErr = db.RecordRenewal(ctx, first, renewalAudit("renewal-00", first.IssuedAt)) })
	<-rec.entered
	// Renewals of nodes 1-7 (7 at the wrong generation), joins of new
	// nodes 0-6, a renewal of the node join 0 writes, and one reusing a
	// serial renewal 1 takes.
	var queued []func() error
	for i := 1; i < n; i++ {
		gen := uint64(1)
		if i == n-1 {
			gen = 2
		}
		c := testRenewal(fmt.Sprintf("node-%02d", i), fmt.Sprintf("r%02d", i), gen, now.Add(time.Hour))
		queued = append(queued, func() error { return db.RecordRenewal(ctx, c, renewalAudit("renewal-"+c.Serial, c.IssuedAt)) })
		j := withAudit(testJoin(hash(fmt.Sprintf("tok%02d", i-1)), fmt.Sprintf("new-%02d", i-1), fmt.Sprintf("n%02d", i-1), now.Add(time.Minute)))
		queued = append(queued, func() error { return db.CompleteJoin(ctx, j) })
	}
	queued = append(queued,
		func() error { return db.RecordRenewal(ctx, testRenewal("new-00", "x1", 1, now.Add(2*time.Hour)), nil) },
		func() error {
			return db.RecordRenewal(ctx, testRenewal("node-02", "r01", 1, now.Add(2*time.Hour)), nil)
		})
	errs := make([]error, len(queued))
	for i, q := range queued {
		wg.Go(func() { errs[i] = q() })
	}
	waitQueued(t, db, len(queued))
	close(rec.release)
	wg.Wait()

	if got := rec.batches(); !slices.Equal(got, []int{1, len(queued)}) {
		t.Fatalf("batches of %v calls, want [1 %d]", got, len(queued))
	}
	if firstErr != nil {
		t.Errorf("renewal 0, alone in the first transaction: %v", firstErr)
	}
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "commit") || errors.Is(err, store.ErrConflict) {
			t.Errorf("call %d in the failed transaction: %v, want the COMMIT's error", i, err)
		}
	}
	if got, err := db.GetNode(ctx, "node-00"); err != nil || !reflect.DeepEqual(got, renewed(before[0], first)) {
		t.Errorf("node-00 after the committed renewal: %+v, %v", got, err)
	}
	for i := 1; i < n; i++ {
		if got, err := db.GetNode(ctx, fmt.Sprintf("node-%02d", i)); err != nil || !reflect.DeepEqual(got, before[i]) {
			t.Errorf("node-%02d after its failed renewal: %+v, %v; want it unchanged", i, got, err)
		}
		if _, err := db.GetCert(ctx, fmt.Sprintf("r%02d", i)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("certificate of failed renewal %d: %v, want none", i, err)
		}
		if _, err := db.GetNode(ctx, fmt.Sprintf("new-%02d", i-1)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("node of failed join %d: %v, want none", i-1, err)
		}
		if tok, err := db.TokenByHash(ctx, hash(fmt.Sprintf("tok%02d", i-1))); err != nil || !tok.UsedAt.IsZero() {
			t.Errorf("token of failed join %d: %+v, %v; want it unspent", i-1, tok, err)
		}
	}
	if es, err := db.ListAudit(ctx, 100); err != nil || len(es) != 1 || es[0].Subject != "renewal-00" {
		t.Errorf("audit trail: %+v, %v; want renewal 0's event alone", es, err)
	}
	// The writer is out of the failed transaction: the next calls commit.
	rec.then = nil
	if err := db.RecordRenewal(ctx, testRenewal("node-01", "r01", 1, now.Add(3*time.Hour)), nil); err != nil {
		t.Errorf("renewal after the failed COMMIT: %v", err)
	}
	if err := db.CompleteJoin(ctx, testJoin(hash("tok00"), "new-00", "n00", now.Add(time.Minute))); err != nil {
		t.Errorf("join after the failed COMMIT: %v", err)
	}
}

// A renewal whose context ends while it waits in the queue returns at
// once and writes nothing; the other calls are not disturbed.
func TestAQueuedRenewalWhoseContextEndsLeavesTheQueue(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := db.CompleteJoin(t.Context(), testJoin(nil, "node-1", "s1", now)); err != nil {
		t.Fatal(err)
	}
	rec := newBatchRecorder(db)
	var first, third error
	var wg sync.WaitGroup
	wg.Go(func() { first = db.RecordRenewal(t.Context(), testRenewal("node-1", "s2", 1, now), nil) })
	<-rec.entered

	ctx, cancel := context.WithCancel(t.Context())
	second := make(chan error, 1)
	go func() {
		second <- db.RecordRenewal(ctx, testRenewal("node-1", "s3", 1, now), renewalAudit("cancelled", now))
	}()
	waitQueued(t, db, 1)
	wg.Go(func() { third = db.RecordRenewal(t.Context(), testRenewal("node-1", "s4", 1, now), nil) })
	waitQueued(t, db, 2)
	cancel()
	select {
	case err := <-second:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled queued renewal: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled renewal waits for the running transaction")
	}
	waitQueued(t, db, 1)
	close(rec.release)
	wg.Wait()
	if first != nil || third != nil {
		t.Errorf("the other renewals: %v, %v", first, third)
	}
	if _, err := db.GetCert(t.Context(), "s3"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("certificate of the cancelled renewal: %v, want none", err)
	}
	if n, err := db.GetNode(t.Context(), "node-1"); err != nil || n.CertSerial != "s4" {
		t.Errorf("node-1: %+v, %v; want serial s4", n, err)
	}
	if audits := auditSubjects(t, db); audits["cancelled"] != 0 {
		t.Error("the cancelled renewal's audit event was written")
	}
}

// endingCtx is a context whose end the waiting call does not see (Done
// is nil): only Err, which the batch checks before each call, reports it.
type endingCtx struct {
	context.Context
	ended atomic.Bool
}

func (c *endingCtx) Done() <-chan struct{} { return nil }

func (c *endingCtx) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

// A call whose context has ended when its batch reaches it is skipped: it
// writes nothing and gets its context's error, and the calls around it
// commit.
func TestACallWhoseContextEndedBeforeItsTurnIsSkipped(t *testing.T) {
	db := openTemp(t)
	defer db.Close()
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := db.CompleteJoin(ctx, testJoin(nil, "node-1", "s1", now)); err != nil {
		t.Fatal(err)
	}
	rec := newBatchRecorder(db)
	var wg sync.WaitGroup
	errs := make([]error, 5)
	wg.Go(func() { errs[0] = db.RecordRenewal(ctx, testRenewal("node-1", "s2", 1, now), nil) })
	<-rec.entered
	wg.Go(func() { errs[1] = db.RecordRenewal(ctx, testRenewal("node-1", "s3", 1, now), nil) })
	waitQueued(t, db, 1)
	ending := &endingCtx{Context: ctx}
	wg.Go(func() {
		errs[2] = db.RecordRenewal(ending, testRenewal("node-1", "s4", 1, now), renewalAudit("skipped", now))
	})
	waitQueued(t, db, 2)
	endingJoin := &endingCtx{Context: ctx}
	wg.Go(func() { errs[3] = db.CompleteJoin(endingJoin, withAudit(testJoin(nil, "node-2", "t1", now))) })
	waitQueued(t, db, 3)
	wg.Go(func() { errs[4] = db.CompleteJoin(ctx, testJoin(nil, "node-3", "u1", now)) })
	waitQueued(t, db, 4)
	ending.ended.Store(true)
	endingJoin.ended.Store(true)
	close(rec.release)
	wg.Wait()
	for i, err := range errs {
		skipped := i == 2 || i == 3
		if skipped && !errors.Is(err, context.Canceled) || !skipped && err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if _, err := db.GetCert(ctx, "s4"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("certificate of the skipped renewal: %v, want none", err)
	}
	if _, err := db.GetNode(ctx, "node-2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node of the skipped join: %v, want none", err)
	}
	if n, err := db.GetNode(ctx, "node-1"); err != nil || n.CertSerial != "s3" {
		t.Errorf("node-1: %+v, %v; want serial s3", n, err)
	}
	if _, err := db.GetNode(ctx, "node-3"); err != nil {
		t.Errorf("node-3: %v", err)
	}
	if audits := auditSubjects(t, db); len(audits) != 0 {
		t.Errorf("audit events %v of skipped calls", audits)
	}
}
