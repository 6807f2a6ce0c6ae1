package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/forkbox/forkbox/fleet"
)

// The fleet simulation's operations: heartbeats, the schedule of creates
// and destroys, placement.

// heartbeat writes h's record every fleet.DefaultHeartbeat (from a random
// phase, as hosts started at different times) until ctx ends.
func (r *simRun) heartbeat(ctx context.Context, h *simHost) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(rand.N(fleet.DefaultHeartbeat)):
	}
	next := time.Now()
	for ctx.Err() == nil {
		wctx, cancel := context.WithTimeout(ctx, fleet.DefaultHeartbeat)
		err := r.regs[h.node].Put(wctx, r.record(h))
		cancel()
		d := time.Since(next)
		if r.counting.Load() {
			r.t.mu.Lock()
			if err == nil {
				r.t.heartbeat, r.t.heartbeats = append(r.t.heartbeat, d), r.t.heartbeats+1
			}
			r.t.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				r.t.fail(fmt.Errorf("heartbeat: %w", err))
			}
		}
		next = next.Add(fleet.DefaultHeartbeat)
		for !next.After(time.Now()) { // a write longer than a beat misses beats
			next = next.Add(fleet.DefaultHeartbeat)
			if r.counting.Load() {
				r.t.mu.Lock()
				r.t.missedHB++
				r.t.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(next)):
		}
	}
}

// schedule calls op at the step's rate, each call in its own goroutine
// (at most simMaxInflight at once) with its scheduled time, until stop
// ends; wg counts the calls. The calls run with ctx (not stop, so that
// the step's end cuts none in half and the directory holds exactly the
// sessions counted live), each for at most simOpTimeout.
func (r *simRun) schedule(stop, ctx context.Context, wg *sync.WaitGroup, op func(ctx context.Context, at time.Time)) {
	sem := make(chan struct{}, simMaxInflight)
	interval := time.Duration(float64(time.Second) / r.step.rate)
	start := time.Now()
	for k := 0; ; k++ {
		at := start.Add(time.Duration(k) * interval)
		select {
		case <-stop.Done():
			return
		case <-time.After(time.Until(at)):
		}
		select {
		case <-stop.Done():
			return
		case sem <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			octx, cancel := context.WithTimeout(ctx, simOpTimeout)
			defer cancel()
			op(octx, at)
		}()
	}
}

// create places one session: its front host (round robin) reads the
// hosts, picks one (the freer of two placeable hosts drawn at random)
// and that host writes its directory entry.
func (r *simRun) create(ctx context.Context, at time.Time) {
	id := r.nextID()
	front := r.hosts[int(r.seq.Load())%len(r.hosts)]
	t0 := time.Now()
	var hosts []fleet.Host
	var err error
	listed := false
	switch r.step.read {
	case readView:
		hosts = front.view.Hosts()
	case readTTL:
		hosts, listed, err = front.ttlHosts(ctx, r.regs[front.node])
	default:
		hosts, err = r.regs[front.node].List(ctx)
		listed = true
	}
	if listed && r.counting.Load() {
		r.t.mu.Lock()
		r.t.lists++
		r.t.mu.Unlock()
	}
	read := time.Since(t0)
	if err != nil {
		r.countFail(ctx, fmt.Errorf("read the hosts: %w", err))
		return
	}
	owner := r.pick(hosts)
	if owner == nil {
		r.countFail(ctx, fmt.Errorf("no placeable host among %d", len(hosts)))
		return
	}
	s := simSession{id: id, host: owner}
	t1 := time.Now()
	if err := r.dirs[owner.node].Put(ctx, r.location(s)); err != nil {
		r.countFail(ctx, fmt.Errorf("directory write: %w", err))
		return
	}
	write := time.Since(t1)
	owner.load.Add(1)
	r.mu.Lock()
	r.live = append(r.live, s)
	r.mu.Unlock()
	if r.counting.Load() {
		r.t.mu.Lock()
		r.t.place, r.t.read, r.t.write = append(r.t.place, time.Since(at)), append(r.t.read, read), append(r.t.write, write)
		r.t.creates++
		r.t.mu.Unlock()
	}
}

// pick returns the freer of two placeable hosts of hosts drawn at random
// (free: capacity minus load, as the records say), nil when none is.
func (r *simRun) pick(hosts []fleet.Host) *simHost {
	var ok []*fleet.Host
	for i := range hosts {
		if hosts[i].Placeable && hosts[i].Load.Sessions < hosts[i].Capacity.Sessions {
			ok = append(ok, &hosts[i])
		}
	}
	if len(ok) == 0 {
		return nil
	}
	a, b := ok[rand.IntN(len(ok))], ok[rand.IntN(len(ok))]
	if b.Capacity.Sessions-b.Load.Sessions > a.Capacity.Sessions-a.Load.Sessions {
		a = b
	}
	return r.byID[a.ID]
}

// destroyOldest ends the oldest live session: its host deletes the
// directory entry.
func (r *simRun) destroyOldest(ctx context.Context, at time.Time) {
	r.mu.Lock()
	if len(r.live) == 0 {
		r.mu.Unlock()
		return
	}
	s := r.live[0]
	r.live = r.live[1:]
	r.mu.Unlock()
	if err := r.dirs[s.host.node].Delete(ctx, fleet.KindSession, s.id); err != nil {
		r.countFail(ctx, fmt.Errorf("directory delete: %w", err))
		// It lives on (its entry is still there), the newest now.
		r.mu.Lock()
		r.live = append(r.live, s)
		r.mu.Unlock()
		return
	}
	s.host.load.Add(-1)
	if r.counting.Load() {
		r.t.mu.Lock()
		r.t.destroy = append(r.t.destroy, time.Since(at))
		r.t.destroys++
		r.t.mu.Unlock()
	}
}

// countFail counts err when it happened in the measured time and not
// because the step ended.
func (r *simRun) countFail(ctx context.Context, err error) {
	if r.counting.Load() && ctx.Err() == nil {
		r.t.fail(err)
	}
}
