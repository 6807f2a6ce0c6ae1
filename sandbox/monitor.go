package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// processListInterval is how often, at most, the monitor lists one
// sandbox's processes for the mining check (listing a gVisor sandbox's
// starts a runsc process). A mining signal counts for the detector's
// whole window, so a miner is still caught within it.
const processListInterval = 15 * time.Second

// monitor samples every running session each abuse interval, from the
// host: it adds the CPU each used since the last sample to its tenant's
// daily usage (ending the tenant's sessions when its budget is used up),
// feeds the abuse detector (killing on a verdict), and ends sessions
// whose sandbox died by itself. Each round's duration is a metric, and a
// round longer than the interval counts as an overrun.
func (m *Manager) monitor() {
	defer m.wg.Done()
	interval := m.detector.Config().Interval
	t := time.NewTicker(interval)
	defer t.Stop()
	listed := map[string]time.Time{} // when each sandbox's processes were listed last
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		start := time.Now()
		finished := m.sampleAll(listed)
		took := time.Since(start)
		m.opts.Metrics.ObserveMonitorRound(took, !finished || took > interval)
	}
}

// sample reads sb's CPU time and tasks from the host: the driver's cheap
// reading (runtime.Sampler) when it has one, else its Stats. A cheap
// reading counts the runtime's own host tasks too (the gVisor Sentry's
// threads and stubs, under a host limit with headroom for them), so when
// it shows as many tasks as the session's pids limit or more, the
// sandbox may sit at that limit inside (a fork bomb the Sentry refuses):
// then the driver's Stats, which count the sandbox's own tasks, decide
// the tasks and the limit the detector sees.
func (m *Manager) sample(ctx context.Context, sb *Sandbox) (runtime.Stats, error) {
	drv := m.driverOf(sb)
	var st runtime.Stats
	var err error
	if s, ok := drv.(runtime.Sampler); ok {
		st, err = s.Sample(ctx, sb.id)
		if limit := sb.Record().Pids; err == nil && limit > 0 && st.Pids >= limit {
			if full, ferr := drv.Stats(ctx, sb.id); ferr == nil {
				st.Pids, st.PidsLimit = full.Pids, limit
				st.PidsLimitHits = max(st.PidsLimitHits, full.PidsLimitHits)
			}
		}
	} else {
		st, err = drv.Stats(ctx, sb.id)
	}
	if err == nil && st.ReadAt.IsZero() {
		st.ReadAt = time.Now()
	}
	return st, err
}

// sampleAll takes one round of samples: a cheap reading of every running
// session from the host, the CPU they used written to the store in one
// transaction, then the budget and abuse checks. listed holds when each
// sandbox's processes were last listed (kept from round to round). It
// returns false when the round ran out of its interval and stopped early.
func (m *Manager) sampleAll(listed map[string]time.Time) bool {
	ctx, cancel := context.WithTimeout(context.Background(), m.detector.Config().Interval)
	defer cancel()
	policies := map[string]*tenancy.Policy{}
	deleted := map[string]bool{}
	policy := func(tenant string) *tenancy.Policy {
		if p, ok := policies[tenant]; ok {
			return p
		}
		p, err := m.TenantPolicy(ctx, tenant)
		if err != nil {
			deleted[tenant] = errors.Is(err, errdefs.ErrNotFound)
			policies[tenant] = nil
			return nil
		}
		policies[tenant] = &p
		return &p
	}
	m.mu.Lock()
	running := make([]*Sandbox, 0, len(m.live))
	for _, sb := range m.live {
		sb.mu.Lock()
		if sb.rec.State == node.StateRunning && !sb.tearing && sb.rec.Tenant != "" {
			running = append(running, sb)
		}
		sb.mu.Unlock()
	}
	m.mu.Unlock()

	type reading struct {
		sb  *Sandbox
		rec node.Session
		st  runtime.Stats
	}
	readings := make([]reading, 0, len(running))
	cpu := make([]store.CPUReading, 0, len(running))
	finished := true
	for _, sb := range running {
		if ctx.Err() != nil {
			m.log.Warn("abuse monitor: round did not finish within its interval", "sessions", len(running))
			finished = false
			break
		}
		rec := sb.Record()
		if policy(rec.Tenant); deleted[rec.Tenant] {
			// Its tenant was deleted (a create that raced the deletion,
			// or one from before a crash during it): nobody may use it.
			go func() {
				_ = m.teardown(context.Background(), sb, node.ReasonDeleted, "its tenant was deleted")
			}()
			continue
		}
		st, err := m.sample(ctx, sb)
		if err != nil {
			// Ended meanwhile, or a reading failed: next round. A sandbox
			// that died by itself (a gVisor sandbox over its memory) is
			// ended now rather than at its next call.
			if ctx.Err() == nil {
				_ = m.checkDead(ctx, sb.id)
			}
			continue
		}
		readings = append(readings, reading{sb: sb, rec: rec, st: st})
		cpu = append(cpu, store.CPUReading{Session: sb.id, Tenant: rec.Tenant, TotalMS: int64(st.CPUSeconds * 1000), At: st.ReadAt})
	}
	totals, err := m.opts.Store.AddSessionsCPU(ctx, cpu)
	if err != nil {
		m.log.Warn("count sessions' CPU", "sessions", len(cpu), "err", err)
	}

	over := map[string]int64{} // tenants past their budget: CPU-ms used
	seen := make(map[string]bool, len(readings))
	for _, r := range readings {
		seen[r.sb.id] = true
		if total, ok := totals[r.rec.Tenant]; ok {
			if p := policy(r.rec.Tenant); p != nil && p.CPUSecondsPerDay > 0 && total >= p.CPUSecondsPerDay*1000 {
				over[r.rec.Tenant] = total
			}
		}
		var procs func() []abuse.Process
		if pl, ok := m.driverOf(r.sb).(runtime.ProcessLister); ok {
			id := r.sb.id
			procs = func() []abuse.Process {
				if at, ok := listed[id]; ok && time.Since(at) < processListInterval {
					return nil // the signal of the last listing still counts
				}
				listed[id] = time.Now()
				ps, err := pl.Processes(ctx, id)
				if err != nil {
					return nil
				}
				out := make([]abuse.Process, len(ps))
				for i, p := range ps {
					out[i] = abuse.Process{Name: p.Name, Cmdline: p.Cmdline}
				}
				return out
			}
		}
		limit := r.rec.Pids
		if r.st.PidsLimit > 0 {
			limit = r.st.PidsLimit
		}
		v := m.detector.Observe(r.sb.id, abuse.Sample{Time: r.st.ReadAt, CPUSeconds: r.st.CPUSeconds, CPULimit: r.rec.CPU,
			PidsLimitHits: r.st.PidsLimitHits, Pids: r.st.Pids, PidsLimit: limit}, procs)
		if v != nil {
			go m.endForAbuse(r.sb, *v, node.ReasonAbuse)
		}
	}
	for id := range listed {
		if !seen[id] {
			delete(listed, id)
		}
	}
	for tenant, used := range over {
		m.endForBudget(tenant, used, policy(tenant).CPUSecondsPerDay)
	}
	return finished
}

// countCPU reads sb's CPU time from the host and adds what it used since
// the last reading to its tenant's day (the last reading before its
// cgroup goes). Warm-pool members count for nobody.
func (m *Manager) countCPU(ctx context.Context, sb *Sandbox) {
	rec := sb.Record()
	if rec.Tenant == "" || rec.State == node.StatePooled {
		return
	}
	st, err := m.sample(ctx, sb)
	if err != nil {
		return
	}
	if _, err := m.opts.Store.AddSessionCPU(ctx, sb.id, rec.Tenant, int64(st.CPUSeconds*1000), st.ReadAt); err != nil {
		m.log.Warn("count session CPU", "session", sb.id, "tenant", rec.Tenant, "err", err)
	}
}

// endForAbuse ends sb for verdict v with reason (abuse when the detector
// decided from its samples; pids-limit when the sandbox stopped at its
// host pids limit) and the verdict as the detail, so that later calls get
// 410 with it; it flags the tenant and records both.
func (m *Manager) endForAbuse(sb *Sandbox, v abuse.Verdict, reason string) {
	sb.mu.Lock()
	first := !sb.abused
	sb.abused = true
	sb.mu.Unlock()
	rec := sb.Record()
	ctx := context.Background()
	if first {
		m.log.Warn("abuse: ending session", "session", sb.id, "tenant", rec.Tenant, "pattern", v.Pattern, "reason", v.Reason)
	}
	if err := m.teardown(ctx, sb, reason, v.Reason); err != nil {
		m.log.Error("abuse: end session", "session", sb.id, "err", err)
	}
	// Flagged and recorded once (the monitor and a call may both have
	// seen it), and never for a warm-pool member: nobody's.
	if !first || rec.Tenant == "" {
		return
	}
	m.opts.Metrics.AbuseKill(v.Pattern)
	if err := m.opts.Store.FlagTenant(ctx, rec.Tenant, v.Pattern+": "+v.Reason+" (session "+sb.id+")", time.Now()); err != nil {
		m.log.Error("abuse: flag tenant", "tenant", rec.Tenant, "err", err)
	}
	m.opts.Audit.Record(ctx, audit.Event{Tenant: rec.Tenant, Session: sb.id, Kind: "abuse", Outcome: audit.Denied,
		Detail: map[string]any{"pattern": v.Pattern, "reason": v.Reason, "session_reason": reason, "action": "ended; tenant flagged"}})
}

// endForBudget ends every running or paused session of tenant, which
// used usedMS CPU-milliseconds today against a budget of budgetS
// CPU-seconds (reason quota).
func (m *Manager) endForBudget(tenant string, usedMS, budgetS int64) {
	victims := m.sandboxesOf(tenant, isLive)
	if len(victims) == 0 {
		return
	}
	detail := fmt.Sprintf("the tenant's CPU budget for today is used up (%.1f of %d CPU-seconds)", float64(usedMS)/1000, budgetS)
	m.log.Warn("CPU budget used up: ending the tenant's sessions", "tenant", tenant, "sessions", len(victims))
	m.opts.Audit.Record(context.Background(), audit.Event{Tenant: tenant, Kind: "policy", Outcome: audit.Denied,
		Detail: map[string]any{"rule": node.ProblemCPUBudgetExhausted, "error": detail, "sessions_ended": len(victims)}})
	for _, sb := range victims {
		go func() {
			if err := m.teardown(context.Background(), sb, node.ReasonQuota, detail); err != nil {
				m.log.Error("end session for CPU budget", "session", sb.id, "err", err)
			}
		}()
	}
}

// SessionStates counts the sessions that exist now by state, warm-pool
// members as "pooled" (metrics.Source).
func (m *Manager) SessionStates() map[string]int {
	out := map[string]int{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.live {
		out[string(sb.Record().State)]++
	}
	return out
}

// DigestedEntries counts the entries the storage driver's snapshot
// digests and integrity checks walked in this process (metrics.Source).
func (m *Manager) DigestedEntries() int64 { return storage.DigestedEntries() }

// SnapshotBytes sums what stored snapshots hold, in bytes: their files
// (over their parents) and their memory checkpoints (metrics.Source).
func (m *Manager) SnapshotBytes() (files, memory int64) {
	snaps, err := m.opts.Store.ListSnapshots(context.Background())
	if err != nil {
		return 0, 0
	}
	for _, sn := range snaps {
		files += sn.SizeBytes
		memory += sn.MemoryBytes
	}
	return files, memory
}

// sandboxesOf returns tenant's live sandboxes whose state keep accepts.
func (m *Manager) sandboxesOf(tenant string, keep func(node.State) bool) []*Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*Sandbox
	for _, sb := range m.live {
		if r := sb.Record(); r.Tenant == tenant && keep(r.State) {
			out = append(out, sb)
		}
	}
	return out
}

// TenantSessions counts tenant's sessions that exist now: admitted and
// not ended (creates under way included). It is the admission count.
func (m *Manager) TenantSessions(tenant string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.active[tenant]
}

// EndTenant destroys every session of tenant, including ones whose
// create is still under way, and returns once none is left (the tenant's
// admission count is zero). The caller has made sure no new create can
// start (the tenant is marked deleted). ErrUnavailable if some are still
// there after 3 minutes.
func (m *Manager) EndTenant(ctx context.Context, tenant string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		sbs := m.sandboxesOf(tenant, func(st node.State) bool { return st != node.StatePooled })
		left := m.TenantSessions(tenant)
		if len(sbs) == 0 && left == 0 {
			return nil
		}
		for _, sb := range sbs {
			if err := m.Destroy(context.Background(), sb.id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				m.log.Warn("end a deleted tenant's session", "session", sb.id, "tenant", tenant, "err", err)
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
