package pool

import (
	"context"
	"time"
)

// spareWait bounds how long AwaitSpare waits for a spare being made. A
// spare already being started is ready sooner than a cold start begun
// now would be (both pay one runtime start, the spare's began earlier),
// so a create that finds none ready waits for one rather than starting
// cold, as long as the wait stays within this bound.
const spareWait = time.Second

// AwaitSpare returns when a spare is ready, or at once when none is ready
// and none is being made that is not already awaited by as many other
// callers (each waiter counts one spare being made as its own), or after
// spareWait, or when ctx ends or the pools close. It hands nothing out:
// TakeSpare takes the spare, and another caller may have taken it by
// then (the caller then starts cold). It reports whether a spare was
// ready when it returned.
func (ps *Pools) AwaitSpare(ctx context.Context) bool {
	timer := time.NewTimer(spareWait)
	defer timer.Stop()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for {
		pl := ps.pools[spareKey]
		if pl == nil || ps.halted {
			return false
		}
		if len(pl.ready) > 0 {
			return true
		}
		if pl.starting <= pl.waiting {
			return false
		}
		if ps.spareChanged == nil {
			ps.spareChanged = make(chan struct{})
		}
		changed := ps.spareChanged
		pl.waiting++
		ps.mu.Unlock()
		var done bool
		select {
		case <-changed:
		case <-timer.C:
			done = true
		case <-ctx.Done():
			done = true
		case <-ps.closing:
			done = true
		}
		ps.mu.Lock()
		pl.waiting--
		if done {
			return len(pl.ready) > 0 && ps.pools[spareKey] == pl
		}
	}
}

// spareNews wakes the AwaitSpare callers: a spare became ready, or one
// being made failed. Called with ps.mu held.
func (ps *Pools) spareNews() {
	if ps.spareChanged != nil {
		close(ps.spareChanged)
		ps.spareChanged = nil
	}
}
