package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Group commit of joins and renewals. With synchronous=FULL every COMMIT
// waits for an fdatasync, and the single writer connection runs one
// transaction at a time, so concurrent writes would each wait for every
// earlier one's sync. Instead, CompleteJoin and RecordRenewal calls that
// arrive while such a transaction is running wait in one queue, in the
// order they came; when it ends, the first of them runs the waiting calls
// (up to maxBatch, joins and renewals mixed) in one transaction, each call
// in its own SAVEPOINT, in queue order, and commits them with one COMMIT.
// A call that fails is rolled back to its savepoint alone and its caller
// gets its error; the others commit. Every caller gets its result only
// after that COMMIT has returned, so a nil result means the write is on
// disk. A batch is thus the calls of the queue run one after the other, as
// separate transactions would run them, but made durable together: a
// renewal sees the node a join earlier in its batch wrote, and a join or a
// renewal whose serial an earlier call of the batch took is refused.
//
// Nothing waits for company: a call that finds no batched transaction
// running runs at once, alone, exactly as a single write transaction.
//
// A batch runs under no caller's context: a context ending mid-statement
// would interrupt the connection (sqlite3_interrupt), which can roll back
// the whole transaction. Each call's context is checked before its write
// runs; a call whose context ends while it waits in the queue leaves the
// queue and returns at once. A batch of one runs under its caller's
// context, as a write transaction does.

// maxBatch bounds the calls of one transaction.
const maxBatch = 128

var (
	qSavepoint  = newWriteQuery(`SAVEPOINT batch_call`)
	qRollbackTo = newWriteQuery(`ROLLBACK TO batch_call`)
	qRelease    = newWriteQuery(`RELEASE batch_call`)
)

// op is a write that can share a transaction with others: a join
// (joinCall) or a renewal (renewalCall), with its column values already
// converted.
type op interface {
	// write makes the op's changes in t. After an error the caller rolls
	// them back.
	write(t *wtx) error
	// String names the op in the error of a transaction it broke.
	String() string
}

// call is one batched call: its op and its result.
type call struct {
	ctx context.Context
	op  op

	// state says what became of the call in its batch.
	state callState
	err   error
	// lead, when set before done is closed, is the batch this call is to
	// run: it was first in the queue when the previous batch ended.
	lead []*call
	// done is closed once err, or lead, is set. Only queued calls have it.
	done chan struct{}
	// queued says the call waits in commitQueue.calls; guarded by its mu.
	queued bool
}

type callState int

const (
	notRun  callState = iota
	skipped           // its context had ended; nothing was written
	ran               // its op ran in the transaction
)

// commitQueue holds the calls waiting for the running batch.
type commitQueue struct {
	mu    sync.Mutex
	busy  bool // a batch is running
	calls []*call
}

// batched runs o, alone or with others, and returns its result once the
// transaction that holds it has committed. ctx must not have ended.
func (d *DB) batched(ctx context.Context, o op) error {
	c := &call{ctx: ctx, op: o}
	q := &d.queue
	q.mu.Lock()
	if !q.busy {
		q.busy = true
		q.mu.Unlock()
		d.runBatch([]*call{c})
		return c.err
	}
	c.done = make(chan struct{})
	c.queued = true
	q.calls = append(q.calls, c)
	q.mu.Unlock()

	select {
	case <-c.done:
	case <-ctx.Done():
		q.mu.Lock()
		if c.queued {
			i := slices.Index(q.calls, c)
			q.calls = slices.Delete(q.calls, i, i+1)
			c.queued = false
			q.mu.Unlock()
			return ctx.Err()
		}
		q.mu.Unlock()
		// A batch has taken the call: its result is the batch's.
		<-c.done
	}
	if c.lead != nil {
		d.runBatch(c.lead)
	}
	return c.err
}

// runBatch runs batch, whose first call is the caller's own, then hands
// the calls that queued meanwhile to the first of them, and then gives the
// other calls of batch their results.
func (d *DB) runBatch(batch []*call) {
	finished := false
	defer func() {
		// Even if the batch panicked: the queue must not stall, and no
		// call may take an unknown outcome for a success.
		if !finished {
			for _, c := range batch {
				c.err = errors.New("write transaction did not finish")
			}
		}
		d.handOff(batch)
	}()
	d.commitBatch(batch)
	finished = true
}

// handOff gives the calls queued behind batch, up to maxBatch, to the
// first of them to run, or marks the queue idle; then it wakes the calls
// of batch but the first, the caller's own.
func (d *DB) handOff(batch []*call) {
	q := &d.queue
	q.mu.Lock()
	var next []*call
	if n := min(len(q.calls), maxBatch); n > 0 {
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

// commitBatch runs the ops of batch in one transaction, in order, and sets
// each call's state and err. If the transaction does not commit, every
// call whose context had not ended fails with the reason, a call refused
// with ErrConflict included: its refusal may have rested on a write that
// is not committed either.
func (d *DB) commitBatch(batch []*call) {
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
	// Alone, a call needs no savepoint: if it fails, nothing commits.
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
		if c.err = c.op.write(t); c.err != nil {
			if savepoints {
				if err := undo(t); err != nil {
					// Not %w: the call's own error (a conflict, say) is
					// not the other calls'.
					lost = fmt.Errorf("after the %s failed (%v): %w", c.op, c.err, err)
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
			failBatch(batch, fmt.Errorf("commit: %w", err))
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
		failBatch(batch, fmt.Errorf("transaction of %d calls failed: %w", len(batch), errors.Join(lost, rerr)))
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

// undo rolls the transaction back to the savepoint of the call that
// failed, and releases it. An error means the transaction is lost: SQLite
// rolls a transaction back by itself after some errors (a full disk, an
// I/O error), and then the savepoint is gone.
func undo(t *wtx) error {
	if _, err := t.exec(qRollbackTo); err != nil {
		return fmt.Errorf("roll back to savepoint: %w", err)
	}
	if _, err := t.exec(qRelease); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// failBatch gives err to every call of batch but those skipped.
func failBatch(batch []*call, err error) {
	for _, c := range batch {
		if c.state != skipped {
			c.err = err
		}
	}
}
