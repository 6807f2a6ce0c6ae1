package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
)

// TestEndForAbuseOnce: when the monitor and a call both see a sandbox
// stop at its pids limit, both wait for its one teardown, and the abuse is
// recorded (and the tenant flagged) once.
func TestEndForAbuseOnce(t *testing.T) {
	drv := &fakeDriver{deleting: make(chan struct{}, 2), release: make(chan struct{})}
	m, sb := newTestManager(t, drv)
	sb.rec.Tenant = "default"
	v := abuse.New(abuse.Config{}).PidsLimitStop(sb.id)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.mon.EndForAbuse(sb, v, node.ReasonPidsLimit)
		}()
	}
	<-drv.deleting
	close(drv.release)
	wg.Wait()
	ctx := context.Background()
	rec, err := m.opts.Store.GetSession(ctx, sb.id)
	if err != nil || rec.State != node.StateTerminated || rec.Reason != node.ReasonPidsLimit || rec.Detail != v.Reason {
		t.Fatalf("record %+v %v, want terminated with reason pids-limit", rec, err)
	}
	recs, err := m.opts.Store.ListAudit(ctx, store.AuditFilter{Kind: "abuse"})
	if err != nil || len(recs) != 1 {
		t.Fatalf("abuse records %d (%v), want 1", len(recs), err)
	}
	tn, err := m.opts.Store.GetTenant(ctx, "default")
	if err != nil || tn.FlaggedAt.IsZero() {
		t.Fatalf("tenant %+v %v, want it flagged", tn, err)
	}
}

// testAudit is the audit recorder of the manager's tests: real records in
// the test's store.
func testAudit(st *store.Store, log *slog.Logger) *audit.Recorder { return audit.New(st, log) }
