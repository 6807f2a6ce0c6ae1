package admission

import (
	"context"
	"sync"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/keyed"
	"github.com/forkbox/forkbox/metrics"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// capacityRetry is the Retry-After of a create refused for capacity or
// concurrency: sessions end at any time, so soon.
const capacityRetry = 5 * time.Second

// Options configure a Controller.
type Options struct {
	// Store holds the tenants (their policies and flags) and their CPU
	// use of the day.
	Store *store.Store
	// Capacity bounds what the host runs at once (503
	// capacity-unavailable past it).
	Capacity Capacity
	// Audit records every refusal ("policy" records); nil records nothing.
	Audit *audit.Recorder
	// Metrics counts refusals by problem type; nil counts nothing.
	Metrics *metrics.Set
	// Fleet, when set, holds tenants' max_sessions and max_snapshots
	// over every host of the fleet, not only this one; nil (a host
	// alone): this host's counts only.
	Fleet FleetQuota
	// ImportsDir, when set, is the directory marking the snapshots this
	// host imported from other hosts (datadir.Layout.FleetImports: one
	// ID.json each). Those copies are stored here as the tenant's, but
	// the host that took the snapshot counts it already, so this host's
	// part of the fleet's snapshot count leaves them out.
	ImportsDir string
}

// Controller decides what a tenant may have on this host: its sessions
// (policy, suspension, CPU budget, concurrency, host capacity), snapshots
// and imported templates (quotas). It keeps the admission counts: every
// admitted session holds a Reservation until it ends. Safe for concurrent
// use.
type Controller struct {
	opts Options

	mu sync.Mutex
	// active counts admitted sessions that have not ended, by tenant;
	// all and memoryMB (MiB) over all tenants.
	active   map[string]int
	all      int
	memoryMB int64
	// stopping: Stop was called; every later Admit is refused.
	stopping bool
	// making counts snapshots and template imports under way, by
	// "what/tenant", for their quotas (ReserveQuota).
	making map[string]int
	// quotaLocks serialise the count and bookkeeping of one quota.
	quotaLocks keyed.Mutex
	// fleetHeld counts what this host holds of the fleet's counts
	// (Options.Fleet): sessions by tenant (admitted, and confirmed by
	// the fleet when the tenant has a limit), snapshots being made by
	// "snapshots/tenant" (confirmed by the fleet). Under mu.
	fleetHeld map[string]int
}

// New returns a controller with opts. opts.Store must be set.
func New(opts Options) *Controller {
	return &Controller{opts: opts, active: map[string]int{}, making: map[string]int{}, fleetHeld: map[string]int{}}
}

// Tenant reads tenant name's record and decodes its policy, in one read.
// ErrNotFound for an unknown (or deleted) tenant.
func (c *Controller) Tenant(ctx context.Context, name string) (*store.Tenant, tenancy.Policy, error) {
	t, err := c.opts.Store.GetTenant(ctx, name)
	if err != nil {
		return nil, tenancy.Policy{}, err
	}
	p, err := PolicyOf(t)
	return t, p, err
}

// Policy returns tenant's policy. ErrNotFound for an unknown tenant.
func (c *Controller) Policy(ctx context.Context, tenant string) (tenancy.Policy, error) {
	_, p, err := c.Tenant(ctx, tenant)
	return p, err
}

// Check refuses a normalized create spec that tenant's policy p does not
// allow (Violation says how); each refusal is also a "policy" audit
// record naming the rule.
func (c *Controller) Check(ctx context.Context, tenant string, p tenancy.Policy, spec *node.CreateSpec) error {
	err := Violation(p, spec)
	if err != nil {
		c.opts.Audit.Record(ctx, audit.Event{Tenant: tenant, Kind: "policy", Outcome: audit.Denied,
			Detail: map[string]any{"rule": ruleOf(err), "error": err.Error()}})
	}
	return err
}

// CheckNetwork refuses an allow-list for a running session of tenant
// that its policy's egress ceiling does not cover (EgressViolation),
// recorded as a "policy" audit record like a create's refusal. ErrNotFound
// when the tenant is unknown.
func (c *Controller) CheckNetwork(ctx context.Context, tenant string, allow []string) error {
	if tenant == "" {
		return nil
	}
	p, err := c.Policy(ctx, tenant)
	if err != nil {
		return err
	}
	err = EgressViolation(p, allow)
	if err != nil {
		c.opts.Audit.Record(ctx, audit.Event{Tenant: tenant, Kind: "policy", Outcome: audit.Denied,
			Detail: map[string]any{"rule": ruleOf(err), "error": err.Error()}})
	}
	return err
}

// CheckTimeout refuses a new timeout of seconds for a session of tenant
// over its policy's max_timeout_s (TimeoutViolation). A tenant whose
// policy cannot be read is not refused here: its sessions end with it.
func (c *Controller) CheckTimeout(ctx context.Context, tenant string, seconds int64) error {
	if tenant == "" {
		return nil
	}
	p, err := c.Policy(ctx, tenant)
	if err != nil {
		return nil
	}
	return TimeoutViolation(p, seconds)
}

func ruleOf(err error) string {
	if te, ok := err.(*errdefs.TypedError); ok {
		return te.Type
	}
	return "max-size:" + errdefs.Field(err)
}

// Admit reserves a place for one more session of tenant t (policy p)
// with memoryMB MiB, or refuses: the tenant is flagged and its policy
// suspends it then (403 tenant-suspended), its CPU budget for today is
// used up (429 cpu-budget-exhausted, Retry-After until the next UTC
// midnight), it is at its concurrent-session limit (429
// tenant-concurrency-exceeded), or the host is full or stopping (503
// capacity-unavailable); those two with a Retry-After of 5 s. Each
// refusal is a "policy" audit record and a metric. The counts run from
// admission to the session's end (its sandbox holds the reservation and
// releases it at teardown), so parallel creates never get past a limit.
// The returned context carries the reservation (ReservationOf) to the
// sandbox the create makes; the caller releases it if the create fails.
// Errors from the store are returned as they are.
func (c *Controller) Admit(ctx context.Context, t *store.Tenant, p tenancy.Policy, memoryMB int64) (context.Context, *Reservation, error) {
	tenant := t.Name
	if p.SuspendWhenFlagged && !t.FlaggedAt.IsZero() {
		return nil, nil, c.refuse(ctx, tenant, errdefs.Typed(errdefs.ErrPermissionDenied, node.ProblemTenantSuspended,
			"tenant %s is suspended: flagged for abuse (%s); an admin clears the flag", tenant, t.FlagReason))
	}
	if p.CPUSecondsPerDay > 0 {
		now := time.Now()
		used, err := c.opts.Store.TenantCPU(ctx, tenant, now)
		if err != nil {
			return nil, nil, err
		}
		used = c.FleetCPU(ctx, tenant, used, now) // the fleet's, in a cluster
		if BudgetUsed(p, used) {
			e := errdefs.Typed(errdefs.ErrResourceExhausted, node.ProblemCPUBudgetExhausted,
				"tenant %s used its %d CPU-seconds for today (UTC)", tenant, p.CPUSecondsPerDay)
			e.RetryAfter = untilTomorrow(time.Now())
			return nil, nil, c.refuse(ctx, tenant, e)
		}
	}
	capacity := c.opts.Capacity
	c.mu.Lock()
	var e *errdefs.TypedError
	switch {
	case c.stopping:
		e = errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity, "the daemon is stopping and destroying its sessions")
	case p.MaxSessions > 0 && c.active[tenant] >= p.MaxSessions:
		e = errdefs.Typed(errdefs.ErrResourceExhausted, node.ProblemTenantConcurrency,
			"tenant %s is at its limit of %d concurrent sessions", tenant, p.MaxSessions)
	case capacity.MaxSessions > 0 && c.all >= capacity.MaxSessions:
		e = errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity,
			"this host runs its maximum of %d sessions", capacity.MaxSessions)
	case capacity.MaxMemoryMB > 0 && c.memoryMB+memoryMB > capacity.MaxMemoryMB:
		e = errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity,
			"this host has no room for %d MiB more memory (%d of %d MiB committed)", memoryMB, c.memoryMB, capacity.MaxMemoryMB)
	}
	if e != nil {
		c.mu.Unlock()
		e.RetryAfter = capacityRetry
		return nil, nil, c.refuse(ctx, tenant, e)
	}
	r := c.reserve(tenant, memoryMB)
	c.mu.Unlock()
	if c.opts.Fleet == nil {
		return context.WithValue(ctx, reservationKey{}, r), r, nil
	}
	held := func() {
		c.countHeld(tenant, 1)
		c.mu.Lock()
		r.fleet = true
		c.mu.Unlock()
	}
	if p.MaxSessions <= 0 {
		held()
		return context.WithValue(ctx, reservationKey{}, r), r, nil
	}
	err := c.holdFleet(ctx, "sessions", tenant, p.MaxSessions, func() int { return c.FleetCount("sessions", tenant) + 1 }, held,
		func(msg string) *errdefs.TypedError {
			e := errdefs.Typed(errdefs.ErrResourceExhausted, node.ProblemTenantConcurrency,
				"tenant %s is at its limit of %d concurrent sessions over the fleet (%s)", tenant, p.MaxSessions, msg)
			e.RetryAfter = capacityRetry
			return e
		})
	if err != nil {
		r.Release()
		return nil, nil, c.refuse(ctx, tenant, err.(*errdefs.TypedError))
	}
	return context.WithValue(ctx, reservationKey{}, r), r, nil
}

// Adopt counts a session of tenant with memoryMB MiB that this host runs
// already (one a restarted daemon adopts), without any check, and
// returns its reservation.
func (c *Controller) Adopt(tenant string, memoryMB int64) *Reservation {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.reserve(tenant, memoryMB)
	if c.opts.Fleet != nil {
		// The fleet's count takes it at the next reconciliation.
		r.fleet = true
		c.fleetHeld[tenant]++
	}
	return r
}

// Stop refuses every later Admit (503 capacity-unavailable), for a
// daemon that is destroying its sessions. Reservations already held stay
// until released.
func (c *Controller) Stop() {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
}

// Admitted counts the sessions admitted (or adopted) over all tenants
// that have not ended.
func (c *Controller) Admitted() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.all
}

// TenantSessions counts tenant's sessions that exist now: admitted and
// not ended (creates under way included). It is the admission count.
func (c *Controller) TenantSessions(tenant string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active[tenant]
}

// refuse records an admission refusal and returns it.
func (c *Controller) refuse(ctx context.Context, tenant string, e *errdefs.TypedError) error {
	c.opts.Audit.Record(ctx, audit.Event{Tenant: tenant, Kind: "policy", Outcome: audit.Denied,
		Detail: map[string]any{"rule": e.Type, "error": e.Msg}})
	c.opts.Metrics.Refused(e.Type)
	return e
}
