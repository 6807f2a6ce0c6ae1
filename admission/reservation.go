package admission

import (
	"context"
)

// Reservation is one session's place in the admission counts, from its
// admission until it ends (or its create fails). Release is idempotent.
type Reservation struct {
	c        *Controller
	tenant   string
	memoryMB int64
	released bool // under c.mu
	// fleet: the session is in c.fleetHeld (under c.mu).
	fleet bool
}

// reserve counts a session of tenant with memoryMB; the caller holds c.mu.
func (c *Controller) reserve(tenant string, memoryMB int64) *Reservation {
	c.active[tenant]++
	c.all++
	c.memoryMB += memoryMB
	return &Reservation{c: c, tenant: tenant, memoryMB: memoryMB}
}

// Release gives the place back; a nil or released reservation does
// nothing.
func (r *Reservation) Release() {
	if r == nil {
		return
	}
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.released {
		return
	}
	r.released = true
	if c.active[r.tenant]--; c.active[r.tenant] <= 0 {
		delete(c.active, r.tenant)
	}
	c.all--
	c.memoryMB -= r.memoryMB
	if r.fleet {
		if c.fleetHeld[r.tenant]--; c.fleetHeld[r.tenant] <= 0 {
			delete(c.fleetHeld, r.tenant)
		}
		tenant := r.tenant
		c.syncFleet("sessions", tenant, func() int { return c.FleetCount("sessions", tenant) })
	}
}

type reservationKey struct{}

// ReservationOf returns the reservation Admit put in ctx, or nil (a
// warm-pool member's create, which is not admitted).
func ReservationOf(ctx context.Context) *Reservation {
	r, _ := ctx.Value(reservationKey{}).(*Reservation)
	return r
}
