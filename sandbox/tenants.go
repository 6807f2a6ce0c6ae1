package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// Tenants owns the core's per-tenant calls: the admission counts and
// quotas (package admission) and ending every session of a deleted
// tenant. It is safe for concurrent use.
type Tenants struct{ m *Manager }

// callerTenant is the tenant a create of ctx belongs to.
func callerTenant(ctx context.Context) string {
	return tenancy.TenantOf(ctx, store.DefaultTenant)
}

// reservationOf returns the admission reservation a create carries in
// ctx (nil for warm-pool members, which are not admitted).
func reservationOf(ctx context.Context) *admission.Reservation {
	return admission.ReservationOf(ctx)
}

// TenantSessions counts tenant's sessions that exist now: admitted and
// not ended (creates under way included). It is the admission count
// (admission.Controller.TenantSessions).
func (tn *Tenants) TenantSessions(tenant string) int { return tn.m.adm.TenantSessions(tenant) }

// FleetCount is this host's own count of what ("sessions",
// "snapshots") for tenant as the fleet's quota counts take it
// (admission.Controller.FleetCount).
func (tn *Tenants) FleetCount(what, tenant string) int { return tn.m.adm.FleetCount(what, tenant) }

// ReserveQuota takes a place for one more snapshot ("snapshots"),
// imported template ("templates") or volume ("volumes") of tenant, or refuses with 429
// tenant-quota-exceeded; see admission.Controller.ReserveQuota.
func (tn *Tenants) ReserveQuota(ctx context.Context, tenant, what string, count func() (int, error)) (release func(), err error) {
	return tn.m.adm.ReserveQuota(ctx, tenant, what, count)
}

// sandboxesOf returns tenant's live sandboxes whose state keep accepts.
func (tn *Tenants) sandboxesOf(tenant string, keep func(node.State) bool) []*Sandbox {
	tn.m.mu.Lock()
	defer tn.m.mu.Unlock()
	var out []*Sandbox
	for _, sb := range tn.m.live {
		if r := sb.Record(); r.Tenant == tenant && keep(r.State) {
			out = append(out, sb)
		}
	}
	return out
}

// EndTenant destroys every session of tenant, including ones whose
// create is still under way, and returns once none is left (the tenant's
// admission count is zero). The caller has made sure no new create can
// start (the tenant is marked deleted). ErrUnavailable if some are still
// there after 3 minutes.
func (tn *Tenants) EndTenant(ctx context.Context, tenant string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		sbs := tn.sandboxesOf(tenant, func(st node.State) bool { return st != node.StatePooled })
		left := tn.TenantSessions(tenant)
		if len(sbs) == 0 && left == 0 {
			return nil
		}
		for _, sb := range sbs {
			if err := tn.m.Destroy(context.Background(), sb.id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				tn.m.log.Warn("end a deleted tenant's session", "session", sb.id, "tenant", tenant, "err", err)
			}
		}
		if time.Now().After(deadline) {
			return errdefs.Newf(errdefs.ErrUnavailable, "tenant %s still has %d sessions", tenant, left)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
