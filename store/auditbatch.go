package store

import (
	"context"
	"database/sql"
	"sync"
)

// maxAuditBatch bounds the appends one transaction carries, so that the
// caller that commits a batch waits for a bounded one.
const maxAuditBatch = 256

// auditQueue is the group commit of audit records: every request an
// exec, a file call or a session call makes is audited before its answer,
// and on one SQLite connection each commit waits for the one before.
// Appends that arrive while a batch commits queue up; when it is done,
// the first of them commits all that queued meanwhile in one transaction,
// and every caller returns when the transaction holding its records
// committed. Nobody waits for more than the batch in flight and its own;
// no goroutine runs between appends.
type auditQueue struct {
	mu      sync.Mutex
	pending []*auditAppend
	busy    bool // a caller is committing a batch
	commits int  // transactions committed (for tests)
}

// auditAppend is one AppendAudit call waiting in the queue.
type auditAppend struct {
	rows []auditRow
	done chan error    // the outcome of the transaction that held rows
	lead chan struct{} // this caller commits the next batch
}

// append writes rows (one AppendAudit call) in the queue's next batch and
// returns that batch's error (or, when a batch of several appends fails,
// the error of rows written alone).
func (q *auditQueue) append(ctx context.Context, s *Store, rows []auditRow) error {
	me := &auditAppend{rows: rows, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	q.mu.Lock()
	q.pending = append(q.pending, me)
	if q.busy {
		q.mu.Unlock()
		select {
		case err := <-me.done:
			return err
		case <-me.lead: // the batch in flight is done and this call is first in line
		}
		q.mu.Lock()
	}
	q.busy = true
	n := min(len(q.pending), maxAuditBatch)
	batch := q.pending[:n:n]
	q.pending = q.pending[n:]
	q.mu.Unlock()

	commits := s.commitAudit(ctx, batch)

	q.mu.Lock()
	q.commits += commits
	if len(q.pending) > 0 {
		q.pending[0].lead <- struct{}{}
	} else {
		q.busy = false
	}
	q.mu.Unlock()
	return <-me.done
}

// commitAudit writes batch in one transaction and tells each append its
// outcome. When that transaction fails and holds more than one append,
// each is written again in a transaction of its own, so that one append's
// failure is not another's. It returns the transactions committed.
func (s *Store) commitAudit(ctx context.Context, batch []*auditAppend) int {
	err := s.auditTx(ctx, batch)
	if err == nil || len(batch) == 1 {
		for _, a := range batch {
			a.done <- err
		}
		if err != nil {
			return 0
		}
		return 1
	}
	commits := 0
	for _, a := range batch {
		err := s.auditTx(ctx, []*auditAppend{a})
		if err == nil {
			commits++
		}
		a.done <- err
	}
	return commits
}

// auditTx inserts the rows of batch in one transaction.
func (s *Store) auditTx(ctx context.Context, batch []*auditAppend) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	ins := tx.StmtContext(ctx, s.auditIns)
	defer ins.Close()
	for _, a := range batch {
		for _, row := range a.rows {
			if err := insertAudit(ctx, ins, row); err != nil {
				return err
			}
		}
	}
	return tx.Commit()
}

// prepareAuditInsert prepares insertAuditSQL on the store's connection,
// once, for every batch to use.
func (s *Store) prepareAuditInsert(ctx context.Context) (*sql.Stmt, error) {
	return s.db.PrepareContext(ctx, insertAuditSQL)
}
