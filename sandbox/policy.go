package sandbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// capacityRetry is the Retry-After of a create refused for capacity or
// concurrency: sessions end at any time, so soon.
const capacityRetry = 5 * time.Second

// TenantPolicy returns tenant's policy. ErrNotFound for an unknown tenant.
func (m *Manager) TenantPolicy(ctx context.Context, tenant string) (tenancy.Policy, error) {
	_, p, err := m.tenant(ctx, tenant)
	return p, err
}

// tenant reads tenant's record and decodes its policy, in one read.
// ErrNotFound for an unknown tenant.
func (m *Manager) tenant(ctx context.Context, name string) (*store.Tenant, tenancy.Policy, error) {
	t, err := m.opts.Store.GetTenant(ctx, name)
	if err != nil {
		return nil, tenancy.Policy{}, err
	}
	p, err := admission.PolicyOf(t)
	return t, p, err
}

// policyDefaults gives the sizes a create request leaves out the server's
// defaults capped at the tenant's bounds, so that a tenant with
// max_memory_mb 256 gets 256 MiB sessions by default rather than a 400.
func policyDefaults(req *node.CreateSpec, p tenancy.Policy, l node.Limits) {
	capped := func(v *int64, def, max int64) {
		if *v == 0 && max > 0 {
			*v = min(def, max)
		}
	}
	if req.CPU == 0 && p.MaxCPU > 0 {
		req.CPU = min(l.DefaultCPU, p.MaxCPU)
	}
	capped(&req.MemoryMB, l.DefaultMemoryMB, p.MaxMemoryMB)
	capped(&req.DiskMB, l.DefaultDiskMB, p.MaxDiskMB)
	capped(&req.Pids, l.DefaultPids, p.MaxPids)
	capped(&req.TimeoutS, l.DefaultTimeoutS, p.MaxTimeoutS)
}

// checkPolicy refuses a normalized create request that tenant's policy
// does not allow: a template off its approved list (400
// image-not-approved), a size over its bounds (400 naming the field), an
// allow-list entry outside its egress ceiling (403 egress-not-allowed).
// Each refusal is also a "policy" audit record.
func (m *Manager) checkPolicy(ctx context.Context, tenant string, p tenancy.Policy, req *node.CreateSpec) error {
	err := policyError(p, req)
	if err != nil {
		m.opts.Audit.Record(ctx, audit.Event{Tenant: tenant, Kind: "policy", Outcome: audit.Denied,
			Detail: map[string]any{"rule": ruleOf(err), "error": err.Error()}})
	}
	return err
}

func ruleOf(err error) string {
	if te, ok := err.(*errdefs.TypedError); ok {
		return te.Type
	}
	return "max-size:" + errdefs.Field(err)
}

func policyError(p tenancy.Policy, req *node.CreateSpec) error {
	if len(p.Templates) > 0 && !slices.Contains(p.Templates, req.Template) {
		e := errdefs.Typed(errdefs.ErrInvalidArgument, node.ProblemImageNotApproved,
			"template %q is not on this tenant's approved list", req.Template)
		e.Field = "template"
		return e
	}
	over := func(field string, limit, v float64) error {
		if limit > 0 && v > limit {
			return errdefs.InvalidField(field, "at most %g for this tenant", limit)
		}
		return nil
	}
	for _, err := range []error{
		over("cpu", p.MaxCPU, req.CPU),
		over("memory_mb", float64(p.MaxMemoryMB), float64(req.MemoryMB)),
		over("disk_mb", float64(p.MaxDiskMB), float64(req.DiskMB)),
		over("pids", float64(p.MaxPids), float64(req.Pids)),
		over("timeout_s", float64(p.MaxTimeoutS), float64(req.TimeoutS)),
	} {
		if err != nil {
			return err
		}
	}
	if req.Network == nil {
		return nil
	}
	ceiling, open := parseCeiling(p.EgressAllow)
	if open {
		return nil
	}
	for i, entry := range req.Network.Allow {
		r, err := netpolicy.ParseRule(entry)
		if err != nil {
			return errdefs.InvalidField(fmt.Sprintf("network.allow[%d]", i), "%v", err)
		}
		if !slices.ContainsFunc(ceiling, func(c netpolicy.Rule) bool { return c.Covers(r) }) {
			e := errdefs.Typed(errdefs.ErrPermissionDenied, node.ProblemEgressNotAllowed,
				"%q is outside this tenant's egress policy", entry)
			e.Field = fmt.Sprintf("network.allow[%d]", i)
			return e
		}
	}
	return nil
}

// parseCeiling parses a tenant's egress ceiling; open is true when it
// holds "*". Entries were validated when the policy was set.
func parseCeiling(entries []string) (rules []netpolicy.Rule, open bool) {
	for _, e := range entries {
		if e == "*" {
			return nil, true
		}
		if r, err := netpolicy.ParseRule(e); err == nil {
			rules = append(rules, r)
		}
	}
	return rules, false
}

// reservation is one session's place in the admission counts, from its
// admission until it ends (or its create fails). release is idempotent.
type reservation struct {
	m        *Manager
	tenant   string
	memoryMB int64
	released bool // under m.mu
}

// reserve counts a session of tenant with memoryMB; the caller holds m.mu.
func (m *Manager) reserve(tenant string, memoryMB int64) *reservation {
	m.active[tenant]++
	m.activeAll++
	m.activeMemory += memoryMB
	return &reservation{m: m, tenant: tenant, memoryMB: memoryMB}
}

// release gives the place back; nil and released reservations do nothing.
func (r *reservation) release() {
	if r == nil {
		return
	}
	m := r.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.released {
		return
	}
	r.released = true
	if m.active[r.tenant]--; m.active[r.tenant] <= 0 {
		delete(m.active, r.tenant)
	}
	m.activeAll--
	m.activeMemory -= r.memoryMB
}

type reservationKey struct{}

// reservationOf returns the reservation a create carries in ctx (nil for
// warm-pool members, which are not admitted).
func reservationOf(ctx context.Context) *reservation {
	r, _ := ctx.Value(reservationKey{}).(*reservation)
	return r
}

// admit reserves a place for one more session of tenant, or refuses: the
// tenant is flagged and its policy suspends it then (403
// tenant-suspended), its CPU budget for today is used up (429 cpu-budget-exhausted), it
// is at its concurrent-session limit (429 tenant-concurrency-exceeded),
// or the host is full (503 capacity-unavailable); each refusal is a
// "policy" audit record. The counts run from admission to the session's
// end (the sandbox holds its reservation, released by its teardown), so
// parallel creates never get past a limit. The returned context carries
// the reservation to the sandbox the create makes; the caller releases it
// if the create fails.
func (m *Manager) admit(ctx context.Context, t *store.Tenant, p tenancy.Policy, memoryMB int64) (context.Context, *reservation, error) {
	tenant := t.Name
	if p.SuspendWhenFlagged && !t.FlaggedAt.IsZero() {
		return nil, nil, m.refuse(ctx, tenant, errdefs.Typed(errdefs.ErrPermissionDenied, node.ProblemTenantSuspended,
			"tenant %s is suspended: flagged for abuse (%s); an admin clears the flag", tenant, t.FlagReason))
	}
	if p.CPUSecondsPerDay > 0 {
		used, err := m.opts.Store.TenantCPU(ctx, tenant, time.Now())
		if err != nil {
			return nil, nil, err
		}
		if used >= p.CPUSecondsPerDay*1000 {
			e := errdefs.Typed(errdefs.ErrResourceExhausted, node.ProblemCPUBudgetExhausted,
				"tenant %s used its %d CPU-seconds for today (UTC)", tenant, p.CPUSecondsPerDay)
			e.RetryAfter = untilTomorrow(time.Now())
			return nil, nil, m.refuse(ctx, tenant, e)
		}
	}
	capacity := m.opts.Capacity
	m.mu.Lock()
	var e *errdefs.TypedError
	switch {
	case m.stopping:
		e = errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity, "the daemon is stopping and destroying its sessions")
	case p.MaxSessions > 0 && m.active[tenant] >= p.MaxSessions:
		e = errdefs.Typed(errdefs.ErrResourceExhausted, node.ProblemTenantConcurrency,
			"tenant %s is at its limit of %d concurrent sessions", tenant, p.MaxSessions)
	case capacity.MaxSessions > 0 && m.activeAll >= capacity.MaxSessions:
		e = errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity,
			"this host runs its maximum of %d sessions", capacity.MaxSessions)
	case capacity.MaxMemoryMB > 0 && m.activeMemory+memoryMB > capacity.MaxMemoryMB:
		e = errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity,
			"this host has no room for %d MiB more memory (%d of %d MiB committed)", memoryMB, m.activeMemory, capacity.MaxMemoryMB)
	}
	if e != nil {
		m.mu.Unlock()
		e.RetryAfter = capacityRetry
		return nil, nil, m.refuse(ctx, tenant, e)
	}
	r := m.reserve(tenant, memoryMB)
	m.mu.Unlock()
	return context.WithValue(ctx, reservationKey{}, r), r, nil
}

// refuse records an admission refusal and returns it.
func (m *Manager) refuse(ctx context.Context, tenant string, e *errdefs.TypedError) error {
	m.opts.Audit.Record(ctx, audit.Event{Tenant: tenant, Kind: "policy", Outcome: audit.Denied,
		Detail: map[string]any{"rule": e.Type, "error": e.Msg}})
	m.opts.Metrics.Refused(e.Type)
	return e
}

// untilTomorrow is the time from now to the next UTC midnight.
func untilTomorrow(now time.Time) time.Duration {
	y, mo, d := now.UTC().Date()
	return time.Date(y, mo, d+1, 0, 0, 0, 0, time.UTC).Sub(now)
}

// callerTenant is the tenant a create of ctx belongs to.
func callerTenant(ctx context.Context) string {
	return tenancy.TenantOf(ctx, store.DefaultTenant)
}

// ReserveQuota takes a place for one more snapshot (what "snapshots")
// or imported template ("templates") of tenant, or refuses with 429
// tenant-quota-exceeded (recorded) when it has as many as its policy
// allows: count says how many it keeps now; ones being made count too.
// The caller runs release once the new one is recorded (or failed).
// Only the count and the bookkeeping hold a per-tenant lock, never the
// snapshot or import itself. No tenant (forkbox's own work) or no limit:
// nothing to reserve.
func (m *Manager) ReserveQuota(ctx context.Context, tenant, what string, count func() (int, error)) (release func(), err error) {
	if tenant == "" {
		return func() {}, nil
	}
	p, err := m.TenantPolicy(ctx, tenant)
	if err != nil {
		return nil, err
	}
	max := map[string]int{"snapshots": p.MaxSnapshots, "templates": p.MaxTemplates}[what]
	if max == 0 {
		return func() {}, nil
	}
	key := what + "/" + tenant
	unlock := m.keyLocks.lock("quota/" + key)
	have, err := count()
	if err != nil {
		unlock()
		return nil, err
	}
	m.mu.Lock()
	making := m.making[key]
	if have+making >= max {
		m.mu.Unlock()
		unlock()
		return nil, m.refuse(ctx, tenant, errdefs.Typed(errdefs.ErrResourceExhausted, node.ProblemTenantQuota,
			"tenant %s has %d %s (%d being made), its limit is %d; delete one first", tenant, have, what, making, max))
	}
	m.making[key]++
	m.mu.Unlock()
	unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			defer m.keyLocks.lock("quota/" + key)()
			m.mu.Lock()
			if m.making[key]--; m.making[key] <= 0 {
				delete(m.making, key)
			}
			m.mu.Unlock()
		})
	}, nil
}
