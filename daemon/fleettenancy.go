package daemon

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/api"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleetstate"
	"github.com/forkbox/forkbox/store"
)

// quotaReconcile is how often the fleet's quota counts are rewritten from
// this host's own and cleared of lost hosts' (fleetstate.Quotas.Reconcile).
const quotaReconcile = 10 * time.Second

// fleetTenancy wires package fleetstate in a cluster: tenants and keys
// shared, quotas held over the fleet, audit records in the fleet's
// stream. Each part opens once the cluster has a quorum; until then
// creates of a tenant with a session or snapshot limit are refused with
// 503 and GET /v1/audit answers 503. A nil *fleetTenancy (a host alone)
// does nothing.
type fleetTenancy struct {
	fh  *fleetHost
	st  *store.Store
	log *slog.Logger

	shared atomic.Pointer[fleetstate.Shared]
	quotas atomic.Pointer[fleetstate.Quotas]
	audit  atomic.Pointer[fleetstate.Audit]

	// early holds the changes made before the shared records opened,
	// handed to them once open (under mu).
	mu    sync.Mutex
	early []store.Change

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// newFleetTenancy returns the fleet's tenancy for a host in a cluster
// (nil alone: tenants, keys, quotas and audit stay this host's), and
// tells st to report its changes to it. Call start once the daemon
// serves.
func newFleetTenancy(fh *fleetHost, st *store.Store, log *slog.Logger) *fleetTenancy {
	if !fh.f.Clustered() {
		return nil
	}
	ft := &fleetTenancy{fh: fh, st: st, log: log}
	st.OnChange(func(c store.Change) {
		ft.mu.Lock()
		sh := ft.shared.Load()
		if sh == nil {
			ft.early = append(ft.early, c)
		}
		ft.mu.Unlock()
		if sh != nil {
			sh.Changed(c)
		}
	})
	st.OnAudit(func() {
		if a := ft.audit.Load(); a != nil {
			a.Notify()
		}
	})
	return ft
}

// quota is admission's way to the fleet's counts (nil alone).
func (ft *fleetTenancy) quota() admission.FleetQuota {
	if ft == nil {
		return nil
	}
	return fleetQuota{ft}
}

// auditReader is GET /v1/audit's reader of the fleet's records (nil
// alone: the store's).
func (ft *fleetTenancy) auditReader() api.AuditReader {
	if ft == nil {
		return nil
	}
	return fleetAudit{ft}
}

// tenancyNode is what the fleet's tenancy needs of the host: its own
// count of a quota, and ending a tenant's sessions (host.Node's).
type tenancyNode interface {
	FleetCount(what, tenant string) int
	EndTenant(ctx context.Context, tenant string) error
}

// start opens the parts in the background, retrying until the cluster
// has a quorum, and runs them until close. A tenant another host deletes
// has its sessions here ended.
func (ft *fleetTenancy) start(n tenancyNode) {
	if ft == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ft.cancel = cancel
	run := func(open func(context.Context) error) {
		ft.wg.Add(1)
		go func() {
			defer ft.wg.Done()
			for ctx.Err() == nil {
				if err := open(ctx); err == nil || ctx.Err() != nil {
					return
				} else {
					ft.log.Warn("fleet: tenancy not available yet; retrying", "err", err)
				}
				pause(ctx)
			}
		}()
	}
	run(func(ctx context.Context) error {
		sh, err := fleetstate.OpenShared(ctx, ft.fh.f, ft.st, ft.log)
		if err != nil {
			return err
		}
		sh.OnDeleted(func(tenant string) {
			ectx, cancel := context.WithTimeout(ctx, 4*time.Minute)
			defer cancel()
			if err := n.EndTenant(ectx, tenant); err != nil {
				ft.log.Warn("fleet: sessions of a tenant deleted on another host not all ended", "tenant", tenant, "err", err)
			}
		})
		ft.mu.Lock()
		ft.shared.Store(sh)
		early := ft.early
		ft.early = nil
		ft.mu.Unlock()
		for _, c := range early {
			sh.Changed(c)
		}
		sh.Run(ctx)
		return nil
	})
	run(func(ctx context.Context) error {
		a, err := fleetstate.OpenAudit(ctx, ft.fh.f, ft.st, ft.log)
		if err != nil {
			return err
		}
		ft.audit.Store(a)
		a.Run(ctx)
		return nil
	})
	run(func(ctx context.Context) error {
		q, err := fleetstate.OpenQuotas(ctx, ft.fh.f, ft.log)
		if err != nil {
			return err
		}
		ft.quotas.Store(q)
		t := time.NewTicker(quotaReconcile)
		defer t.Stop()
		for {
			// Not settled yet (or no registry): this host's own counts
			// are still rewritten, nobody's dropped.
			live, ok := ft.liveHosts(ctx)
			if err := q.Reconcile(ctx, n.FleetCount, live); err != nil && ok && ctx.Err() == nil {
				ft.log.Warn("fleet: quota counts not reconciled", "err", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	})
}

// liveHosts returns the hosts not taken for gone (fleet.Registry.Live);
// nil and false while the registry cannot be read or this host's
// heartbeats have not succeeded for a whole LostAfter (nothing is
// dropped then).
func (ft *fleetTenancy) liveHosts(ctx context.Context) (map[string]bool, bool) {
	reg := ft.fh.reg.Load()
	if reg == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	live, err := reg.Live(ctx)
	return live, err == nil
}

// close stops the parts (before the fleet connection closes).
func (ft *fleetTenancy) close() {
	if ft == nil || ft.cancel == nil {
		return
	}
	ft.cancel()
	ft.wg.Wait()
}

type fleetQuota struct{ ft *fleetTenancy }

// Hold implements admission.FleetQuota (fleetstate.Quotas.Hold):
// ErrUnavailable until the counts are open.
func (q fleetQuota) Hold(ctx context.Context, what, tenant string, max int, mine func() int, held func()) (int, error) {
	qs := q.ft.quotas.Load()
	if qs == nil {
		return 0, errdefs.Newf(errdefs.ErrUnavailable, "the fleet's quota counts are not available yet (the cluster has no quorum)")
	}
	return qs.Hold(ctx, what, tenant, max, mine, held)
}

// Sync implements admission.FleetQuota (fleetstate.Quotas.Sync); before
// the counts are open there is nothing to sync (they are reconciled once
// open).
func (q fleetQuota) Sync(ctx context.Context, what, tenant string, mine func() int) error {
	if qs := q.ft.quotas.Load(); qs != nil {
		return qs.Sync(ctx, what, tenant, mine)
	}
	return nil
}

type fleetAudit struct{ ft *fleetTenancy }

// List implements api.AuditReader (fleetstate.Audit.List): ErrUnavailable
// until the stream is open.
func (a fleetAudit) List(ctx context.Context, f store.AuditFilter) ([]*store.AuditRecord, error) {
	au := a.ft.audit.Load()
	if au == nil {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "the fleet's audit stream is not available yet (the cluster has no quorum)")
	}
	return au.List(ctx, f)
}
