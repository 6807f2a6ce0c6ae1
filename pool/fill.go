package pool

import (
	"context"
	"errors"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// tick is how often a pool that kept failing gets one more try.
const tick = 5 * time.Second

// memberTimeout bounds making one member, and tearing one down.
const memberTimeout = 2 * time.Minute

// Load reads the stored pool configuration and starts the refiller, which
// keeps every pool at its size until Close. Call it once, after the core
// has recovered the sessions of a previous daemon (whose members it tears
// down). An error only when the store cannot be read.
func (ps *Pools) Load(ctx context.Context) error {
	cfgs, err := ps.store.ListPools(ctx)
	if err != nil {
		return err
	}
	ps.mu.Lock()
	for _, c := range cfgs {
		if c.Size > 0 {
			ps.pools[c.Template] = &pool{cfg: *c}
		}
	}
	ps.mu.Unlock()
	ps.wg.Add(1)
	go ps.refill()
	ps.wake()
	return nil
}

// Close stops the refiller and waits for the members being made and torn
// down. Ready template members stay as they are, for the next daemon to
// tear down; the spares, which hold nothing of anybody's, are torn down
// (a daemon that stops leaves only sessions behind). Close the pools
// before the core.
func (ps *Pools) Close() {
	ps.closeOnce.Do(func() { close(ps.closing) })
	ps.wg.Wait()
	ps.mu.Lock()
	var spares []string
	if pl := ps.pools[spareKey]; pl != nil {
		spares, pl.ready = pl.ready, nil
	}
	ps.mu.Unlock()
	ps.discard(spares, "the daemon is stopping")
	ps.wg.Wait()
}

// discard tears members down in the background; Close waits for it.
func (ps *Pools) discard(ids []string, why string) {
	for _, id := range ids {
		ps.wg.Add(1)
		go func() {
			defer ps.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), memberTimeout)
			defer cancel()
			if err := ps.core.Discard(ctx, id, why); err != nil {
				ps.log.Debug("tear down warm-pool member", "session", id, "err", err)
			}
		}()
	}
}

// wake wakes the refiller.
func (ps *Pools) wake() {
	select {
	case ps.kick <- struct{}{}:
	default:
	}
}

// refill keeps every pool at its size until Close, making at most fillers
// members at once.
func (ps *Pools) refill() {
	defer ps.wg.Done()
	sem := make(chan struct{}, fillers)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ps.closing:
			return
		case <-ps.kick:
		case <-t.C:
			// A pool that kept failing gets one more try per tick.
			ps.mu.Lock()
			for _, pl := range ps.pools {
				pl.failures = min(pl.failures, maxFailures-1)
			}
			ps.mu.Unlock()
		}
		ps.mu.Lock()
		ps.startFills(sem)
		ps.mu.Unlock()
	}
}

// startFills starts a fill for every member the pools lack, while sem has
// room. Called with ps.mu held.
func (ps *Pools) startFills(sem chan struct{}) {
	for _, pl := range ps.pools {
		for pl.starting+len(pl.ready) < pl.cfg.Size && pl.failures < maxFailures && !ps.halted {
			select {
			case sem <- struct{}{}:
			default:
				return
			}
			pl.starting++
			ps.wg.Add(1)
			go func(pl *pool, cfg node.Pool) {
				defer ps.wg.Done()
				defer func() { <-sem }()
				ps.fillOne(pl, cfg)
			}(pl, pl.cfg)
		}
	}
}

// fillOne makes one member for pool pl (configured as cfg) and adds it,
// unless the pool no longer wants it.
func (ps *Pools) fillOne(pl *pool, cfg node.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), memberTimeout)
	defer cancel()
	spec := node.CreateSpec{Template: cfg.Template, CPU: cfg.CPU, MemoryMB: cfg.MemoryMB, Pids: cfg.Pids, DiskMB: cfg.DiskMB,
		Isolation: ps.core.DefaultDriver()}
	var id string
	var err error
	if cfg.Template == spareKey {
		id, err = ps.core.LaunchSpare(ctx)
	} else if err = ps.core.Normalize(&spec); err == nil {
		id, err = ps.core.Launch(ctx, spec)
	}
	ps.mu.Lock()
	pl.starting--
	if cfg.Template == spareKey {
		ps.spareNews() // (the waiters look once ps.mu is free, after the spare is added)
	}
	if err != nil && cfg.Template == spareKey && errors.Is(err, errdefs.ErrUnavailable) {
		// The host cannot make spares (any more): stop trying.
		pl.cfg.Size = 0
		ps.mu.Unlock()
		ps.log.Warn("no spare sandboxes on this host", "err", err)
		return
	}
	if err != nil {
		pl.failures++
		ps.mu.Unlock()
		ps.log.Error("warm-pool member failed to start", "template", cfg.Template, "spare", cfg.Template == spareKey, "err", err)
		return
	}
	pl.failures = 0
	select {
	case <-ps.closing:
		// Shutting down: a template member stays, as the ready ones do,
		// for the next daemon to tear down; a spare goes.
		ps.mu.Unlock()
		if cfg.Template == spareKey {
			ps.discard([]string{id}, "the daemon is stopping")
		}
		return
	default:
	}
	keep := !ps.halted && ps.pools[cfg.Template] == pl && sameLimits(pl.cfg, cfg) && len(pl.ready) < pl.cfg.Size
	if keep {
		pl.ready = append(pl.ready, id)
	}
	ps.mu.Unlock()
	if !keep {
		ps.discard([]string{id}, "warm pool no longer needs it")
	}
	ps.wake()
}
