package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// stopAllWithin bounds StopAll: every teardown is bounded itself (2
// minutes); this is the bound of the whole, with retries.
const stopAllWithin = 5 * time.Minute

// stopParallel is how many sandboxes StopAll tears down at once.
const stopParallel = 4

// StopPools stops the warm pools' refilling for good: no member is made
// from now on, and one being made is torn down when it is ready. The pool
// sizes stay stored (the next daemon refills them).
func (m *Manager) StopPools() { m.warm.Halt() }

// StopAll destroys every sandbox the manager has, for a daemon that stops
// with its sessions (serve --stop-sessions, forkbox down): creates are
// refused from now on (503), the pools stop refilling and their members go,
// and every session ends with reason deleted and detail (creates under
// way are destroyed when they finish). It returns once none is left, or
// ErrUnavailable naming how many are when some teardowns still fail after
// a few minutes (their records stay terminating; the next start retries).
func (m *Manager) StopAll(ctx context.Context, detail string) error {
	m.StopPools() // (its ready members are torn down below with the rest)
	m.adm.Stop()

	deadline := time.Now().Add(stopAllWithin)
	for {
		// Admitted first: no admission follows Stop, and an admitted
		// session leaves the live set before its reservation goes.
		admitted := m.adm.Admitted()
		m.mu.Lock()
		left := make([]*Sandbox, 0, len(m.live))
		for _, sb := range m.live {
			left = append(left, sb)
		}
		m.mu.Unlock()
		if len(left) == 0 && admitted == 0 && !m.warm.Filling() {
			return nil
		}
		sem := make(chan struct{}, stopParallel)
		var wg sync.WaitGroup
		for _, sb := range left {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := m.stop(ctx, sb, detail); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					m.log.Warn("stop: destroy", "session", sb.id, "err", err)
				}
			}()
		}
		wg.Wait()
		if time.Now().After(deadline) {
			return errdefs.Newf(errdefs.ErrUnavailable, "%d sandboxes are still there after %s", len(left), stopAllWithin)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop destroys sb for StopAll: a create under way is told to stop and
// waited for, a warm-pool member still being made is left to its maker
// (which tears it down, the pools being stopped), anything else is torn
// down with reason deleted and detail.
func (m *Manager) stop(ctx context.Context, sb *Sandbox, detail string) error {
	launching := false
	if sb.created != nil {
		select {
		case <-sb.created:
		default:
			launching = true
		}
	}
	switch st := sb.Record().State; {
	case launching && st == node.StateCreating:
		return m.Destroy(ctx, sb.id)
	case launching:
		return nil
	}
	return m.teardown(ctx, sb, node.ReasonDeleted, detail)
}
