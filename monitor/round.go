package monitor

import (
	"context"
	"errors"
	"time"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// reading is one sandbox's sample of a round.
type reading struct {
	sb  Sandbox
	rec node.Session
	st  runtime.Stats
}

// round takes one round of samples: a cheap reading of every running
// session from the host, the CPU they used written to the store in one
// transaction, then the budget and abuse checks. It returns false when
// the round ran out of its interval and stopped early.
func (mon *Monitor) round() bool {
	ctx, cancel := context.WithTimeout(context.Background(), mon.detector.Config().Interval)
	defer cancel()
	policies := map[string]*tenancy.Policy{}
	deleted := map[string]bool{}
	policy := func(tenant string) *tenancy.Policy {
		if p, ok := policies[tenant]; ok {
			return p
		}
		p, err := mon.opts.Admission.Policy(ctx, tenant)
		if err != nil {
			deleted[tenant] = errors.Is(err, errdefs.ErrNotFound)
			policies[tenant] = nil
			return nil
		}
		policies[tenant] = &p
		return &p
	}
	running := mon.opts.Core.Running()
	readings := make([]reading, 0, len(running))
	cpu := make([]store.CPUReading, 0, len(running))
	finished := true
	for _, sb := range running {
		if ctx.Err() != nil {
			mon.log.Warn("abuse monitor: round did not finish within its interval", "sessions", len(running))
			finished = false
			break
		}
		rec := sb.Record()
		if policy(rec.Tenant); deleted[rec.Tenant] {
			// Its tenant was deleted (a create that raced the deletion,
			// or one from before a crash during it): nobody may use it.
			go func() {
				_ = mon.opts.Core.End(context.Background(), sb, node.ReasonDeleted, "its tenant was deleted")
			}()
			continue
		}
		st, err := mon.sample(ctx, sb)
		if err != nil {
			// Ended meanwhile, or a reading failed: next round. A sandbox
			// that died by itself (a gVisor sandbox over its memory) is
			// ended now rather than at its next call.
			if ctx.Err() == nil {
				_ = mon.opts.Core.CheckDead(ctx, sb.ID())
			}
			continue
		}
		readings = append(readings, reading{sb: sb, rec: rec, st: st})
		mon.history.add(sb.ID(), node.UsageSample{Time: st.ReadAt.UTC(), CPUSeconds: st.CPUSeconds, MemoryBytes: st.MemoryBytes})
		cpu = append(cpu, store.CPUReading{Session: sb.ID(), Tenant: rec.Tenant, TotalMS: int64(st.CPUSeconds * 1000), At: st.ReadAt})
	}
	totals, err := mon.opts.Store.AddSessionsCPU(ctx, cpu)
	if err != nil {
		mon.log.Warn("count sessions' CPU", "sessions", len(cpu), "err", err)
	}

	// In a fleet a budget holds over every host: each tenant with one
	// counts the fleet's use of the day (this host's written into it).
	for tenant, total := range totals {
		if p := policy(tenant); p != nil && p.CPUSecondsPerDay > 0 {
			totals[tenant] = mon.opts.Admission.FleetCPU(ctx, tenant, total, time.Now())
		}
	}
	over := map[string]int64{} // tenants past their budget: CPU-ms used
	seen := make(map[string]bool, len(readings))
	for _, r := range readings {
		seen[r.sb.ID()] = true
		if total, ok := totals[r.rec.Tenant]; ok {
			if p := policy(r.rec.Tenant); p != nil && admission.BudgetUsed(*p, total) {
				over[r.rec.Tenant] = total
			}
		}
		limit := r.rec.Pids
		if r.st.PidsLimit > 0 {
			limit = r.st.PidsLimit
		}
		v := mon.detector.Observe(r.sb.ID(), abuse.Sample{Time: r.st.ReadAt, CPUSeconds: r.st.CPUSeconds, CPULimit: r.rec.CPU,
			PidsLimitHits: r.st.PidsLimitHits, Pids: r.st.Pids, PidsLimit: limit}, mon.processes(ctx, r.sb))
		if v != nil {
			go mon.EndForAbuse(r.sb, *v, node.ReasonAbuse)
		}
	}
	for id := range mon.listed {
		if !seen[id] {
			delete(mon.listed, id)
		}
	}
	for tenant, used := range over {
		mon.endForBudget(tenant, used, policy(tenant).CPUSecondsPerDay)
	}
	return finished
}

// processes returns the detector's way to list sb's processes (nil when
// its driver cannot): at most once per processListInterval, in between
// nothing (the signal of the last listing still counts).
func (mon *Monitor) processes(ctx context.Context, sb Sandbox) func() []abuse.Process {
	pl, ok := mon.opts.Core.Driver(sb).(runtime.ProcessLister)
	if !ok {
		return nil
	}
	id := sb.ID()
	return func() []abuse.Process {
		if at, ok := mon.listed[id]; ok && time.Since(at) < processListInterval {
			return nil
		}
		mon.listed[id] = time.Now()
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
