package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// Recovery owns start-up reconciliation and the janitor: Recover adopts
// the sandboxes a previous daemon left running and ends or cleans up the
// rest, then starts the janitor, which retries incomplete teardowns until
// the manager closes.
type Recovery struct{ m *Manager }

// janitorInterval is how often leftovers of failed teardowns are retried.
const janitorInterval = 30 * time.Second

// Recover reconciles the database with what the runtime reports, once at
// start-up, and starts the janitor:
//
//   - a running session whose sandbox is alive and whose agent answers is
//     adopted: its timeout is re-armed (an expired one is ended now);
//   - a running session whose sandbox is gone, and any session caught in
//     creating, is cleaned up and ends with reason error;
//   - a paused session is adopted frozen, with its pause deadline re-armed;
//   - a terminating session is cleaned up and ends with its recorded reason;
//   - warm-pool members of the previous daemon are torn down (the pools
//     refill);
//   - a runtime container, sandbox directory, writable layer or snapshot
//     with no live session or snapshot record is removed;
//   - the snapshot of a fork that did not answer (still provisional) is
//     deleted, or set to expire once its sessions end (package snapshot:
//     Reconcile).
func (rv *Recovery) Recover(ctx context.Context) error {
	recs, err := rv.m.opts.Store.ListSessions(ctx, node.SessionFilter{
		States: []node.State{node.StateCreating, node.StateRunning, node.StatePaused,
			node.StateTerminating, node.StatePooled},
	})
	if err != nil {
		return err
	}
	for _, rec := range recs {
		sb := &Sandbox{id: rec.ID, dir: rv.m.opts.Layout.Sandbox(rec.ID), rec: *rec,
			killers: map[int]*time.Timer{}, feeding: map[int]chan struct{}{}, done: make(chan struct{})}
		switch rec.State {
		case node.StateRunning, node.StatePaused:
			if rv.adopt(ctx, sb) {
				continue
			}
			rv.m.register(sb)
			_ = rv.m.teardown(ctx, sb, node.ReasonError, "sandbox was gone when the daemon restarted")
		case node.StateCreating:
			rv.m.register(sb)
			_ = rv.m.teardown(ctx, sb, node.ReasonError, "daemon restarted while the sandbox was being created")
			// The create never answered; a retry with its key tries again.
			if err := rv.m.opts.Store.ReleaseIdempotencyKey(ctx, rec.ID); err != nil {
				rv.m.log.Warn("release idempotency key", "session", rec.ID, "err", err)
			}
		case node.StateTerminating:
			rv.m.register(sb)
			_ = rv.m.teardown(ctx, sb, rec.Reason, rec.Detail)
		case node.StatePooled:
			rv.m.register(sb)
			_ = rv.m.teardown(ctx, sb, node.ReasonDeleted, "warm-pool member of a previous daemon")
		}
	}
	rv.sweepOrphans(ctx)
	rv.sweepStorage(ctx)
	rv.m.snaps.Reconcile(ctx) // (snapshot files the database does not know, interrupted forks)
	if rv.m.opts.Net != nil {
		// Networks of sessions that ended while the daemon was down.
		if err := rv.m.opts.Net.Sweep(func(id string) bool { return rv.m.lookup(id) != nil }); err != nil {
			rv.m.log.Warn("sweep networks", "err", err)
		}
	}
	if rv.m.opts.IDs != nil {
		// Host id slices of sandboxes that ended while the daemon was
		// down, or of creates a crash cut short.
		if err := rv.m.opts.IDs.Sweep(func(id string) bool { return rv.m.lookup(id) != nil }); err != nil {
			rv.m.log.Warn("sweep host id slices", "err", err)
		}
	}
	if err := rv.m.warm.Load(ctx); err != nil {
		return err
	}
	rv.m.wg.Add(1)
	go rv.janitor()
	return nil
}

// adopt takes over a sandbox that survived a daemon restart. It reports
// false when the sandbox is not usable.
func (rv *Recovery) adopt(ctx context.Context, sb *Sandbox) bool {
	// A sandbox of a version before host identities has none, and its
	// directory was left open to everyone (0711) under a then closed
	// parent: close it to all but its (storage) ids.
	if _, err := os.Lstat(filepath.Join(sb.dir, identityUserns)); errors.Is(err, os.ErrNotExist) {
		if err := sandboxDirGroup(sb.dir, rv.m.opts.Shift.GIDBase); err != nil && !errors.Is(err, os.ErrNotExist) {
			rv.m.log.Warn("restrict the directory of an adopted sandbox", "session", sb.id, "err", err)
		}
	}
	drv := rv.m.runtimes.driverOf(sb)
	st, err := drv.Status(ctx, sb.id)
	paused := sb.rec.State == node.StatePaused
	if err == nil && st == runtime.StatusPaused && paused {
		st = runtime.StatusRunning // frozen on purpose: adopt as it is
	} else if err == nil && st == runtime.StatusPaused {
		// A running session found frozen: the previous daemon died between
		// the freeze and the thaw of an exec kill or a snapshot.
		if err := drv.Resume(ctx, sb.id); err != nil {
			rv.m.log.Warn("adopt: thaw frozen sandbox", "session", sb.id, "err", err)
		} else {
			st = runtime.StatusRunning
		}
	}
	if err != nil || st != runtime.StatusRunning {
		return false
	}
	sb.agent = guest.New(filepath.Join(sb.dir, "agent.sock"))
	// The agent is the sandbox's init, so a running sandbox has a live
	// agent; connecting to its socket proves it still listens. Whether it
	// answers quickly is another matter: a sandbox that starves itself of
	// CPU (a small quota and busy processes) can take seconds to answer
	// /health, and must not be destroyed, with its files, for that.
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err = sb.agent.Listening(hctx)
	if err != nil && drv.Capabilities().MemorySnapshot {
		// The previous daemon may have died during a memory snapshot,
		// leaving the agent prepared and waiting for a resume file whose
		// generation only it knew: generation 0 resumes any.
		if werr := writeResume(filepath.Join(sb.dir, "ctl"), wire.ResumeFile{Hostname: sb.id}); werr == nil {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			err = sb.agent.WaitReady(rctx)
			rcancel()
		}
	}
	if err != nil {
		rv.m.log.Warn("adopt: agent socket does not accept connections", "session", sb.id, "err", err)
		return false
	}
	if paused && st == runtime.StatusRunning {
		// The runtime says thawed, the record paused: freeze it again.
		if s2, _ := drv.Status(ctx, sb.id); s2 != runtime.StatusPaused {
			if err := drv.Pause(ctx, sb.id); err != nil {
				rv.m.log.Warn("adopt: refreeze paused sandbox", "session", sb.id, "err", err)
			}
		}
	}
	if sb.rec.Network != nil {
		// Without its egress service the sandbox is still fenced (the
		// namespace's rules stay): it loses its network for a while, not
		// its files and processes, so it is adopted either way and the
		// egress service is retried in the background.
		att, err := rv.m.hostRes.attachNetwork(sb, true, nil)
		if err != nil {
			rv.m.log.Warn("adopt: egress service not started yet; retrying", "session", sb.id, "err", err)
			rv.m.wg.Add(1)
			go rv.m.hostRes.retryNetwork(sb)
		}
		sb.net = att
	}
	rv.m.register(sb)
	if rv.m.opts.Volumes != nil && len(sb.rec.Volumes) > 0 {
		rv.m.opts.Volumes.Adopt(ctx, sb.rec.Tenant, sb.id, sb.rec.Volumes, rv.m.log)
	}
	if time.Now().After(sb.rec.ExpiresAt) {
		_ = rv.m.teardown(ctx, sb, node.ReasonTimeout, "session timeout reached while the daemon was down")
		return true
	}
	sb.lastUse = time.Now()
	rv.m.arm(sb)
	rv.m.armIdle(sb)
	rv.m.log.Info("adopted sandbox", "session", sb.id, "state", sb.rec.State)
	return true
}

// sweepStorage removes writable layers no live session owns (snapshots
// the database does not know are the snapshot service's: Reconcile).
func (rv *Recovery) sweepStorage(ctx context.Context) {
	layers, err := rv.m.opts.Storage.Layers(ctx)
	if err != nil {
		rv.m.log.Warn("list writable layers", "err", err)
	}
	if rv.m.opts.Volumes != nil {
		// Copies of snapshots' volumes whose session ended while no
		// daemon ran go before the sweep (it then removes their layers).
		rv.m.opts.Volumes.ReclaimCopies(ctx, func(id string) bool { return rv.m.lookup(id) != nil }, rv.m.log)
	}
	for _, id := range layers {
		if rv.m.lookup(id) == nil && (rv.m.opts.Volumes == nil || !rv.m.opts.Volumes.OwnsLayer(ctx, id)) {
			if err := rv.m.opts.Storage.Remove(ctx, id); err != nil {
				rv.m.log.Warn("remove orphaned layer", "id", id, "err", err)
			}
		}
	}
}

func (m *Manager) register(sb *Sandbox) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.live[sb.id] = sb
	// An adopted session keeps its place in the admission counts.
	if r := sb.Record(); r.Tenant != "" && r.State != node.StatePooled && r.State != node.StateTerminated {
		sb.res = m.adm.Adopt(r.Tenant, r.MemoryMB)
	}
}

// sweepOrphans removes runtime containers and sandbox directories that no
// live session owns.
func (rv *Recovery) sweepOrphans(ctx context.Context) {
	var ids []string
	for _, d := range rv.m.opts.Drivers {
		dids, err := d.List(ctx)
		if err != nil {
			rv.m.log.Warn("list runtime sandboxes", "driver", d.Name(), "err", err)
		}
		ids = append(ids, dids...)
	}
	entries, err := os.ReadDir(rv.m.opts.Layout.Sandboxes())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		rv.m.log.Warn("list sandbox directories", "err", err)
	}
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] || rv.m.lookup(id) != nil {
			continue
		}
		seen[id] = true
		if err := rv.m.cleanup(ctx, id, ""); err != nil {
			rv.m.log.Warn("remove orphaned sandbox", "id", id, "err", err)
		} else {
			rv.m.log.Info("removed orphaned sandbox", "id", id)
		}
	}
}

// janitor retries teardowns that failed and deletes expired snapshots,
// until Close.
func (rv *Recovery) janitor() {
	defer rv.m.wg.Done()
	t := time.NewTicker(janitorInterval)
	defer t.Stop()
	for {
		select {
		case <-rv.m.closing:
			return
		case <-t.C:
		}
		rv.m.mu.Lock()
		var stuck []*Sandbox
		for _, sb := range rv.m.live {
			sb.mu.Lock()
			if sb.rec.State == node.StateTerminating && !sb.tearing {
				stuck = append(stuck, sb)
			}
			sb.mu.Unlock()
		}
		rv.m.mu.Unlock()
		for _, sb := range stuck {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			rec := sb.Record()
			_ = rv.m.teardown(ctx, sb, rec.Reason, rec.Detail)
			cancel()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		rv.m.snaps.CollectExpired(ctx)
		if n, err := rv.m.opts.Store.PruneEgress(ctx, time.Now().Add(-EgressRetention)); err != nil {
			rv.m.log.Warn("prune egress records", "err", err)
		} else if n > 0 {
			rv.m.log.Info("pruned egress records", "records", n)
		}
		cancel()
	}
}
