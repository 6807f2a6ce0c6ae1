package admission

import (
	"context"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// ReserveQuota takes a place for one more snapshot (what "snapshots"),
// imported template ("templates") or volume ("volumes") of tenant, or refuses with 429
// tenant-quota-exceeded (recorded) when it has as many as its policy
// allows: count says how many it keeps now; ones being made count too.
// The caller runs release once the new one is recorded (or failed).
// Only the count and the bookkeeping hold a per-tenant lock, never the
// snapshot or import itself. No tenant (forkbox's own work) or no limit:
// nothing to reserve. ErrNotFound for an unknown tenant; count's error
// is returned as it is.
func (c *Controller) ReserveQuota(ctx context.Context, tenant, what string, count func() (int, error)) (release func(), err error) {
	if tenant == "" {
		return func() {}, nil
	}
	p, err := c.Policy(ctx, tenant)
	if err != nil {
		return nil, err
	}
	max := map[string]int{"snapshots": p.MaxSnapshots, "templates": p.MaxTemplates, "volumes": p.MaxVolumes}[what]
	if max == 0 {
		return func() {}, nil
	}
	key := what + "/" + tenant
	unlock := c.quotaLocks.Lock(key)
	have, err := count()
	if err != nil {
		unlock()
		return nil, err
	}
	c.mu.Lock()
	making := c.making[key]
	if have+making >= max {
		c.mu.Unlock()
		unlock()
		return nil, c.refuse(ctx, tenant, errdefs.Typed(errdefs.ErrResourceExhausted, node.ProblemTenantQuota,
			"tenant %s has %d %s (%d being made), its limit is %d; delete one first", tenant, have, what, making, max))
	}
	c.making[key]++
	c.mu.Unlock()
	unlock()
	held := false // under the fleet's lock, then once release runs
	if what == "snapshots" && c.opts.Fleet != nil {
		mine := func() int { return c.FleetCount(what, tenant) + 1 }
		err := c.holdFleet(ctx, what, tenant, max, mine, func() { held = true; c.countHeld(key, 1) }, func(msg string) *errdefs.TypedError {
			return errdefs.Typed(errdefs.ErrResourceExhausted, node.ProblemTenantQuota,
				"tenant %s is at its limit of %d %s over the fleet (%s); delete one first", tenant, max, what, msg)
		})
		if err != nil {
			c.unmake(key)
			return nil, c.refuse(ctx, tenant, err.(*errdefs.TypedError))
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			c.unmake(key)
			if held {
				c.countHeld(key, -1)
				c.syncFleet(what, tenant, func() int { return c.FleetCount(what, tenant) })
			}
		})
	}, nil
}

// unmake counts one fewer of key ("what/tenant") being made.
func (c *Controller) unmake(key string) {
	defer c.quotaLocks.Lock(key)()
	c.mu.Lock()
	if c.making[key]--; c.making[key] <= 0 {
		delete(c.making, key)
	}
	c.mu.Unlock()
}
