package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// queueAppends holds the store's one connection, starts an AppendAudit
// of each record in its own goroutine, waits until the first is waiting
// for the connection and every other is queued behind it, then lets the
// connection go. It returns each append's error, in the order of recs.
func queueAppends(t *testing.T, s *Store, recs []*AuditRecord) []error {
	t.Helper()
	ctx := context.Background()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	for i, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.AppendAudit(ctx, r)
		}()
		if i == 0 {
			waitQueue(t, s, func(busy bool, _ int) bool { return busy })
		}
	}
	waitQueue(t, s, func(busy bool, pending int) bool { return busy && pending == len(recs)-1 })
	conn.Close()
	wg.Wait()
	return errs
}

// waitQueue waits (at most a minute: a hang guard) until ok holds of the
// audit queue.
func waitQueue(t *testing.T, s *Store, ok func(busy bool, pending int) bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		s.auditQ.mu.Lock()
		done := ok(s.auditQ.busy, len(s.auditQ.pending))
		s.auditQ.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(end) {
			t.Fatal("the audit queue never got there")
		}
	}
}

// TestAuditGroupCommit proves appends that arrive while one commits are
// written together in the next transaction: 1 + 15 appends take two
// commits, each caller gets its record's own seq, and every record is
// there after the database is closed and opened again.
func TestAuditGroupCommit(t *testing.T) {
	s, path := openTemp(t)
	recs := make([]*AuditRecord, 16)
	for i := range recs {
		recs[i] = &AuditRecord{Tenant: "a", Session: "s1", Kind: "exec", Outcome: "ok", RequestID: fmt.Sprint(i)}
	}
	for i, err := range queueAppends(t, s, recs) {
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	s.auditQ.mu.Lock()
	commits, busy := s.auditQ.commits, s.auditQ.busy
	s.auditQ.mu.Unlock()
	if commits != 2 || busy {
		t.Fatalf("%d commits (busy %v) for 1 + 15 queued appends, want 2", commits, busy)
	}
	seqs := map[int64]string{}
	for _, r := range recs {
		if r.Seq == 0 || seqs[r.Seq] != "" {
			t.Fatalf("record %s: seq %d (taken by %q)", r.RequestID, r.Seq, seqs[r.Seq])
		}
		seqs[r.Seq] = r.RequestID
	}
	s.Close()
	again, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	got, err := again.ListAudit(context.Background(), AuditFilter{})
	if err != nil || len(got) != len(recs) {
		t.Fatalf("after reopening: %d records, %v; want %d", len(got), err, len(recs))
	}
	for _, r := range got {
		if seqs[r.Seq] != r.RequestID {
			t.Fatalf("record seq %d is request %q, its append was told %q", r.Seq, r.RequestID, seqs[r.Seq])
		}
	}
}

// TestAuditGroupCommitIsolatesFailure proves one append the database
// refuses fails alone: the others of its batch are written and told so.
func TestAuditGroupCommitIsolatesFailure(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	if _, err := s.db.ExecContext(ctx, `CREATE TRIGGER audit_test_poison BEFORE INSERT ON audit
		WHEN NEW.kind = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned record'); END`); err != nil {
		t.Fatal(err)
	}
	recs := make([]*AuditRecord, 6)
	for i := range recs {
		recs[i] = &AuditRecord{Tenant: "a", Kind: "exec", Outcome: "ok", RequestID: fmt.Sprint(i)}
	}
	recs[3].Kind = "poison"
	errs := queueAppends(t, s, recs)
	for i, err := range errs {
		if i == 3 {
			if err == nil || !strings.Contains(err.Error(), "poisoned record") {
				t.Fatalf("the refused append: %v, want its error", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("append %d beside a refused one: %v", i, err)
		}
	}
	got, err := s.ListAudit(ctx, AuditFilter{})
	if err != nil || len(got) != 5 {
		t.Fatalf("%d records, %v; want the 5 not refused", len(got), err)
	}
	for _, r := range got {
		if r.Kind == "poison" {
			t.Fatalf("the refused record was written: %+v", r)
		}
	}
}

// BenchmarkAppendAuditParallel measures audit writes by 8 callers at once
// (requests of several clients), which share commits.
func BenchmarkAppendAuditParallel(b *testing.B) {
	s, _ := openTemp(b)
	ctx := context.Background()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.AppendAudit(ctx, &AuditRecord{Tenant: "acme", Session: "s1", Kind: "exec", Outcome: "ok",
				RequestID: "r", Detail: map[string]any{"command_sha256": strings.Repeat("a", 64), "exit_code": 0}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
