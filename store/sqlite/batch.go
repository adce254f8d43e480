package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nodetrust/nodetrust/store"
)

// Group commit of joins. With synchronous=FULL every COMMIT waits for an
// fdatasync, and the single writer connection runs one transaction at a
// time, so concurrent joins would each wait for every earlier join's sync.
// Instead, CompleteJoin calls that arrive while a join transaction is
// running wait in a queue; when it ends, the first of them runs the
// waiting calls (up to maxJoinBatch) in one transaction, each join in its
// own SAVEPOINT, and commits them with one COMMIT. A join that fails is
// rolled back to its savepoint alone and its caller gets its error; the
// others commit. Every caller gets its result only after that COMMIT has
// returned, so a nil result means the join is on disk.
//
// Nothing waits for company: a call that finds no join transaction running
// runs at once, alone, exactly as a single write transaction.
//
// A batch runs under no caller's context: a context ending mid-statement
// would interrupt the connection (sqlite3_interrupt), which can roll back
// the whole transaction. Each join's context is checked before its join
// runs; a call whose context ends while it waits in the queue leaves the
// queue and returns at once. A batch of one runs under its caller's
// context, as a write transaction does.

// maxJoinBatch bounds the joins of one transaction.
const maxJoinBatch = 128

var (
	qSavepoint  = newWriteQuery(`SAVEPOINT join_call`)
	qRollbackTo = newWriteQuery(`ROLLBACK TO join_call`)
	qRelease    = newWriteQuery(`RELEASE join_call`)
)

// joinCall is one CompleteJoin call: its join with the column values
// already converted, and its result.
type joinCall struct {
	ctx                           context.Context
	j                             store.Join
	now                           sql.NullInt64
	nodeVals, certVals, auditVals []any

	// state says what became of the call in its batch.
	state callState
	err   error
	// lead, when set before done is closed, is the batch this call is to
	// run: it was first in the queue when the previous batch ended.
	lead []*joinCall
	// done is closed once err, or lead, is set. Only queued calls have it.
	done chan struct{}
	// queued says the call waits in joinQueue.calls; guarded by its mu.
	queued bool
}

type callState int

const (
	notRun  callState = iota
	skipped           // its context had ended; nothing was written
	ran               // its join ran in the transaction
)

// joinQueue holds the CompleteJoin calls waiting for the running batch.
type joinQueue struct {
	mu    sync.Mutex
	busy  bool // a batch is running
	calls []*joinCall
}

// joinBatched runs call's join, alone or with others, and returns its
// result once the transaction that holds it has committed.
func (d *DB) joinBatched(call *joinCall) error {
	q := &d.joins
	q.mu.Lock()
	if !q.busy {
		q.busy = true
		q.mu.Unlock()
		d.runJoins([]*joinCall{call})
		return call.err
	}
	call.done = make(chan struct{})
	call.queued = true
	q.calls = append(q.calls, call)
	q.mu.Unlock()

	select {
	case <-call.done:
	case <-call.ctx.Done():
		q.mu.Lock()
		if call.queued {
			i := slices.Index(q.calls, call)
			q.calls = slices.Delete(q.calls, i, i+1)
			call.queued = false
			q.mu.Unlock()
			return call.ctx.Err()
		}
		q.mu.Unlock()
		// A batch has taken the call: its result is the batch's.
		<-call.done
	}
	if call.lead != nil {
		d.runJoins(call.lead)
	}
	return call.err
}

// runJoins runs batch, whose first call is the caller's own, then hands
// the calls that queued meanwhile to the first of them, and then gives the
// other calls of batch their results.
func (d *DB) runJoins(batch []*joinCall) {
	finished := false
	defer func() {
		// Even if the batch panicked: the queue must not stall, and no
		// call may take an unknown outcome for a success.
		if !finished {
			for _, c := range batch {
				c.err = errors.New("join transaction did not finish")
			}
		}
		d.handOff(batch)
	}()
	d.commitJoins(batch)
	finished = true
}

// handOff gives the calls queued behind batch, up to maxJoinBatch, to the
// first of them to run, or marks the queue idle; then it wakes the calls
// of batch but the first, the caller's own.
func (d *DB) handOff(batch []*joinCall) {
	q := &d.joins
	q.mu.Lock()
	var next []*joinCall
	if n := min(len(q.calls), maxJoinBatch); n > 0 {
		next = slices.Clone(q.calls[:n])
		rest := copy(q.calls, q.calls[n:])
		clear(q.calls[rest:])
		q.calls = q.calls[:rest]
		for _, c := range next {
			c.queued = false
		}
	} else {
		q.busy = false
	}
	q.mu.Unlock()

	if next != nil {
		next[0].lead = next
		close(next[0].done)
	}
	for _, c := range batch[1:] {
		close(c.done)
	}
}

// commitJoins runs the joins of batch in one transaction and sets each
// call's state and err. If the transaction does not commit, every call
// whose context had not ended fails with the reason, a join refused with
// ErrConflict included: its refusal may have rested on a join that is not
// committed either.
func (d *DB) commitJoins(batch []*joinCall) {
	ctx := context.Background()
	if len(batch) == 1 {
		ctx = batch[0].ctx
	}
	tx, err := d.w.BeginTx(ctx, nil)
	if err != nil {
		for _, c := range batch {
			c.err = fmt.Errorf("begin: %w", err)
		}
		return
	}
	t := &wtx{ctx: ctx, tx: tx, d: d}
	// Alone, a join needs no savepoint: if it fails, nothing commits.
	savepoints := len(batch) > 1
	written := 0
	var lost error // the transaction can no longer commit
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.state, c.err = skipped, err
			continue
		}
		c.state = ran
		if savepoints {
			if _, err := t.exec(qSavepoint); err != nil {
				lost = fmt.Errorf("savepoint: %w", err)
				break
			}
		}
		if c.err = writeJoin(t, c); c.err != nil {
			if savepoints {
				if err := undoJoin(t); err != nil {
					// Not %w: the join's own error (a conflict, say) is
					// not the other calls'.
					lost = fmt.Errorf("after the join of node %q failed (%v): %w", c.j.Node.ID, c.err, err)
					break
				}
			}
			continue
		}
		if savepoints {
			if _, err := t.exec(qRelease); err != nil {
				lost = fmt.Errorf("release savepoint: %w", err)
				break
			}
		}
		written++
	}

	if lost == nil && written > 0 {
		if d.beforeCommit != nil {
			d.beforeCommit(tx, len(batch))
		}
		if err := tx.Commit(); err != nil {
			failJoins(batch, fmt.Errorf("commit: %w", err))
		}
		return
	}
	// Nothing to commit, or nothing can be.
	rerr := tx.Rollback()
	if errors.Is(rerr, sql.ErrTxDone) {
		rerr = nil
	}
	if rerr != nil {
		rerr = fmt.Errorf("rollback: %w", rerr)
	}
	if lost != nil {
		failJoins(batch, fmt.Errorf("transaction of %d joins failed: %w", len(batch), errors.Join(lost, rerr)))
		return
	}
	if rerr != nil {
		for _, c := range batch {
			if c.state == ran {
				c.err = errors.Join(c.err, rerr)
			}
		}
	}
}

// undoJoin rolls the transaction back to the savepoint of the join that
// failed, and releases it. An error means the transaction is lost: SQLite
// rolls a transaction back by itself after some errors (a full disk, an
// I/O error), and then the savepoint is gone.
func undoJoin(t *wtx) error {
	if _, err := t.exec(qRollbackTo); err != nil {
		return fmt.Errorf("roll back to savepoint: %w", err)
	}
	if _, err := t.exec(qRelease); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// failJoins gives err to every call of batch but those skipped.
func failJoins(batch []*joinCall, err error) {
	for _, c := range batch {
		if c.state != skipped {
			c.err = err
		}
	}
}
