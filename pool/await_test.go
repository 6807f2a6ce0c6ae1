package pool

import (
	"context"
	"testing"
	"time"
)

// TestAwaitSpare: with no spare ready, a waiter counts on a spare being
// made and returns once it is ready (and TakeSpare then hands it out
// once); waiters beyond the spares being made, and any waiter of pools
// without spares, return at once.
func TestAwaitSpare(t *testing.T) {
	c := newProcCore(t)
	c.hold = make(chan struct{})
	ps, _ := newPoolsSpares(t, c, 1)
	waitFor(t, "a spare being made", func() bool { _, s := ps.Spares(); return s == 1 })
	ctx := context.Background()
	got := make(chan bool)
	go func() { got <- ps.AwaitSpare(ctx) }()
	waitFor(t, "the waiter counted", func() bool {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		return ps.pools[spareKey].waiting == 1
	})
	began := time.Now()
	if ps.AwaitSpare(ctx) || time.Since(began) > spareWait/2 {
		t.Fatal("a second waiter, with one spare being made for the first, waited or found one")
	}
	select {
	case <-got:
		t.Fatal("the waiter returned while its spare was still being made")
	case <-time.After(50 * time.Millisecond):
	}
	close(c.hold)
	select {
	case ready := <-got:
		if !ready {
			t.Fatal("the waiter returned without a ready spare")
		}
	case <-time.After(spareWait + time.Second):
		t.Fatal("the waiter did not return")
	}
	if id := ps.TakeSpare(); id == "" {
		t.Fatal("no spare after the wait")
	}
	none, _ := newPoolsSpares(t, newProcCore(t), 0)
	if none.AwaitSpare(ctx) {
		t.Fatal("pools without spares found one")
	}
}
