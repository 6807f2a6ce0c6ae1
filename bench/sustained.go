package bench

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The sustained row: create → exec `true` → destroy, by Clients clients at
// once, for Sustain in all per system, beside `runc run` of /bin/true the
// same way. The time is cut into windows of sustainWindow, alternating
// forkbox and runc (interleave), so that both see the same load; the
// paired ratio is taken window by window on the time per operation.

// sustainWindow is the length of one measured window of the sustained row.
const sustainWindow = 2 * time.Second

// Defaults for the sustained row.
const (
	// DefaultClients is how many clients run at once.
	DefaultClients = 4
	// DefaultSustain is how long each system runs in all.
	DefaultSustain = 10 * time.Second
)

// window runs cycle in clients goroutines until window has passed (a
// cycle started before then is finished and counted) and returns the
// elapsed time, the latency of each completed cycle and the first error.
func window(ctx context.Context, clients int, length time.Duration, cycle func(ctx context.Context, client int) (time.Duration, error)) (time.Duration, []time.Duration, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var first error
	start := time.Now()
	deadline := start.Add(length)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				d, err := cycle(ctx, c)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				if err == nil {
					lat = append(lat, d)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), lat, first
}

// measureSustained measures the sustained row (see above). The rows'
// p50/p99 are of single cycles; PerSecond is completed cycles over the
// whole time; the paired ratio is over windows of the time per cycle.
func (e *env) measureSustained(ctx context.Context) []Result {
	f := e.fb
	clients := e.opts.Clients
	rounds := max(1, int(e.opts.Sustain/sustainWindow))
	type tally struct {
		lat     []time.Duration
		ops     int
		elapsed time.Duration
	}
	tallies := map[string]*tally{SystemForkbox: {}, SystemRunc: {}}
	step := func(system string, cycle func(ctx context.Context, client int) (time.Duration, error)) func(ctx context.Context) ([]time.Duration, error) {
		return func(ctx context.Context) ([]time.Duration, error) {
			el, lat, err := window(ctx, clients, sustainWindow, cycle)
			if err != nil {
				return nil, err
			}
			t := tallies[system]
			t.lat, t.ops, t.elapsed = append(t.lat, lat...), t.ops+len(lat), t.elapsed+el
			return []time.Duration{perOp(el, len(lat))}, nil
		}
	}
	e.opts.progressf("sustained create + exec + destroy, %d clients, %d windows of %s, interleaved with runc run",
		clients, rounds, sustainWindow)
	fb := contender{system: SystemForkbox, step: step(SystemForkbox, func(ctx context.Context, _ int) (time.Duration, error) {
		return timed(func() error { return f.runTrue(ctx) })
	})}
	runc := contender{system: SystemRunc, step: step(SystemRunc, func(ctx context.Context, client int) (time.Duration, error) {
		return e.p.runcRun(ctx, client%maxStartSlots)
	})}
	// No warm-up window: a window is long against any start-up cost.
	rows := e.compete(ctx, 0, rounds, []string{OpSustained}, fb, runc)
	for i := range rows {
		r := &rows[i]
		t, ok := tallies[r.System]
		if !ok || r.Error != "" || r.N == 0 {
			continue
		}
		paired, pairs := r.PairedRatio, r.Pairs
		*r = newResult(r.Operation, r.System, t.lat, nil)
		r.PairedRatio, r.Pairs = paired, pairs
		if t.elapsed > 0 {
			ps := round2(float64(t.ops) / t.elapsed.Seconds())
			r.PerSecond = &ps
		}
		if r.System == SystemForkbox {
			r.Note = fmt.Sprintf("%d clients, %d windows of %s each", clients, rounds, sustainWindow)
		}
	}
	return rows
}
