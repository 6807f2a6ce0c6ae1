package daemon

import (
	"context"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// The daemon's part of hosts leaving and coming back (fleet.LostWatcher,
// fleet.Reconcile, fleet.Registry.Drain): wiring only.

// rejoin is what the host does once the registry and the directory are
// open, before its first heartbeat (so no host places a session here
// before it is done): it destroys the local sessions the fleet gave up on
// while it was away (fleet.Reconcile), retrying until it succeeds or
// first ends; then it starts, until ctx ends, the host-lost watcher and
// one more reconcile a LostAfter later (a watcher that listed this host
// lost just before it came back may mark its entries after the first
// pass; and it retries a first pass that did not complete).
func (fh *fleetHost) rejoin(first, ctx context.Context, reg *fleet.Registry, dir *fleet.Directory) {
	for first.Err() == nil && fh.reconcile(first, dir) != nil {
		pause(first)
	}
	w := fleet.NewLostWatcher(reg, dir, fh.f.NodeID(), fh.log)
	fh.wg.Add(2)
	go func() { defer fh.wg.Done(); w.Run(ctx, 0) }()
	go func() {
		defer fh.wg.Done()
		select {
		case <-ctx.Done():
		case <-time.After(reg.LostAfter()):
			fh.reconcile(ctx, dir)
		}
	}()
}

// reconcile runs one fleet.Reconcile of this host, logging what it did;
// the error is its failure.
func (fh *fleetHost) reconcile(ctx context.Context, dir *fleet.Directory) error {
	if fh.destroy == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	done, err := fleet.Reconcile(rctx, dir, fh.f.NodeID(), fh.destroyLocal)
	if len(done) > 0 {
		fh.log.Warn("fleet: destroyed the sessions the fleet gave up on while this host was away", "sessions", len(done))
	}
	if err != nil && ctx.Err() == nil {
		fh.log.Warn("fleet: reconcile with the directory failed; retrying", "err", err)
	}
	return err
}

// rejoinAfterCut is the registry's Rejoin (fleet.RegistryOptions): after
// this host's heartbeats failed for longer than LostAfter (cut off from
// the quorum while it ran on), the others may have given its sessions up;
// it reconciles before its record says it is back, and once more a
// LostAfter later.
func (fh *fleetHost) rejoinAfterCut(ctx context.Context) error {
	dir, err := fh.directory()
	if err != nil {
		return err
	}
	fh.log.Warn("fleet: heartbeats failed for longer than --host-lost-after; reconciling with the directory")
	return fh.reconcile(ctx, dir)
}

// destroyLocal is fh.destroy unless the daemon is stopping
// (stopDestroys): then ErrUnavailable, and the entry stays for the next
// start's reconcile. A destroy under way delays stopDestroys.
func (fh *fleetHost) destroyLocal(ctx context.Context, id string) error {
	fh.destroyMu.RLock()
	defer fh.destroyMu.RUnlock()
	if fh.destroyStopped {
		return errdefs.Newf(errdefs.ErrUnavailable, "the host is stopping; session %s is destroyed at its next start", id)
	}
	return fh.destroy(ctx, id)
}

// stopDestroys makes reconcile destroy no more sessions, waiting for one
// under way: the daemon calls it before it closes the host's node.
func (fh *fleetHost) stopDestroys() {
	fh.destroyMu.Lock()
	fh.destroyStopped = true
	fh.destroyMu.Unlock()
}

// Drain implements api.HostLister (fleet.Registry.Drain).
func (fh *fleetHost) Drain(ctx context.Context, id string, on bool) error {
	reg := fh.reg.Load()
	if reg == nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "the fleet's host registry is not available yet (the cluster has no quorum)")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return reg.Drain(ctx, id, on)
}

// ended is the REST API's question for a session this host does not
// hold (api.Server.SetEnded): the directory's ErrTerminated for one the
// fleet gave up on, visible to its own tenant only; nil otherwise, and
// while the directory is not open.
func (fh *fleetHost) ended(ctx context.Context, id string) error {
	dir, err := fh.directory()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return dir.Ended(ctx, id, func(tenant string) bool {
		if tenant == "" { // the directory's name of the default tenant
			tenant = store.DefaultTenant
		}
		return tenancy.Owns(ctx, tenant) // as the host's own lookups decide
	})
}
