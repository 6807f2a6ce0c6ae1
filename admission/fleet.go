package admission

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
)

// FleetQuota is a tenant's counts over every host of a fleet
// (fleetstate.Quotas implements it), so that its max_sessions and
// max_snapshots hold fleet-wide: each host writes its own count, read
// and written under the quota's lock as mine() says.
type FleetQuota interface {
	// Hold sets this host's count of what ("sessions", "snapshots") for
	// tenant to mine(), refused with ErrResourceExhausted when it grows
	// and the fleet's sum would pass max (0: no limit); ErrUnavailable
	// when the fleet cannot be asked (no quorum). Once written it runs
	// held under the same lock as mine.
	Hold(ctx context.Context, what, tenant string, max int, mine func() int, held func()) (int, error)
	// Sync sets this host's count of what for tenant to mine() with no
	// limit.
	Sync(ctx context.Context, what, tenant string, mine func() int) error
}

// fleetTimeout bounds one exchange with the fleet's quota counts.
const fleetTimeout = 5 * time.Second

// holdFleet takes the place of one more of what of tenant in the fleet's
// counts, limit max: mine is this host's count with it, held counts it
// once the fleet has it; a
// refusal is returned as refusal says (the same 4xx as this host's own
// count gives), the fleet being unreachable as 503 capacity-unavailable
// with a Retry-After. No fleet: nothing to do.
func (c *Controller) holdFleet(ctx context.Context, what, tenant string, max int, mine func() int, held func(),
	refusal func(msg string) *errdefs.TypedError) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fleetTimeout)
	defer cancel()
	_, err := c.opts.Fleet.Hold(ctx, what, tenant, max, mine, held)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return refusal(err.Error())
	default:
		e := errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity,
			"the fleet's count of tenant %s's %s cannot be read (%v); try again", tenant, what, err)
		e.RetryAfter = capacityRetry
		return e
	}
}

// countHeld adds d to c.fleetHeld[key].
func (c *Controller) countHeld(key string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fleetHeld[key] += d; c.fleetHeld[key] <= 0 {
		delete(c.fleetHeld, key)
	}
}

// syncFleet writes this host's count of what for tenant into the
// fleet's (after a release), in the background; a failure is left to
// the fleet's periodic reconciliation.
func (c *Controller) syncFleet(what, tenant string, mine func() int) {
	if c.opts.Fleet == nil || tenant == "" {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), fleetTimeout)
		defer cancel()
		c.opts.Fleet.Sync(ctx, what, tenant, mine)
	}()
}

// FleetCPU returns tenant's CPU-milliseconds used on the UTC day of at
// over the whole fleet, having written local (this host's own use that
// day, from its store) as this host's part. No fleet, or one that cannot
// be reached: local alone (the budget then holds per host until it can
// be).
func (c *Controller) FleetCPU(ctx context.Context, tenant string, local int64, at time.Time) int64 {
	if c.opts.Fleet == nil {
		return local
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fleetTimeout)
	defer cancel()
	total, err := c.opts.Fleet.Hold(ctx, cpuQuota(at), tenant, 0, func() int { return int(local) }, nil)
	if err != nil {
		return local
	}
	return max(int64(total), local)
}

// cpuQuota is the fleet quota of CPU used on the UTC day of at.
func cpuQuota(at time.Time) string { return "cpu-" + store.UsageDay(at) }

// FleetCount is this host's own count of what ("sessions": admitted and
// not ended; "snapshots": stored, less the copies imported from other
// hosts (Options.ImportsDir), plus being made; "cpu-DAY": the
// CPU-milliseconds its sessions used that UTC day) for tenant, as the
// fleet's counts take it (fleetstate.Quotas.Reconcile): admissions whose
// place the fleet has not confirmed yet are left out. A store that
// cannot be read counts 0 until the next reconciliation.
func (c *Controller) FleetCount(what, tenant string) int {
	if day, ok := strings.CutPrefix(what, "cpu-"); ok {
		at, err := time.Parse(time.DateOnly, day)
		if err != nil {
			return 0
		}
		ctx, cancel := context.WithTimeout(context.Background(), fleetTimeout)
		defer cancel()
		n, err := c.opts.Store.TenantCPU(ctx, tenant, at)
		if err != nil {
			return 0
		}
		return int(n)
	}
	switch what {
	case "sessions":
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.fleetHeld[tenant]
	case "snapshots":
		ctx, cancel := context.WithTimeout(context.Background(), fleetTimeout)
		defer cancel()
		n, err := c.opts.Store.TenantSnapshotCount(ctx, tenant)
		if err != nil {
			return 0
		}
		n = max(n-c.importedSnapshots(ctx, tenant), 0)
		c.mu.Lock()
		defer c.mu.Unlock()
		return n + c.fleetHeld["snapshots/"+tenant]
	}
	return 0
}

// importedSnapshots counts tenant's stored snapshots that Options.ImportsDir
// marks imported from another host (0 without the directory; a mark
// whose snapshot is gone or unreadable counts nothing).
func (c *Controller) importedSnapshots(ctx context.Context, tenant string) int {
	if c.opts.ImportsDir == "" {
		return 0
	}
	marks, err := os.ReadDir(c.opts.ImportsDir)
	if err != nil {
		return 0
	}
	n := 0
	for _, m := range marks {
		id, ok := strings.CutSuffix(m.Name(), ".json")
		if !ok {
			continue
		}
		if sn, err := c.opts.Store.GetSnapshot(ctx, id); err == nil && sn.Tenant == tenant {
			n++
		}
	}
	return n
}
