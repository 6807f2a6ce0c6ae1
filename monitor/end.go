package monitor

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/node"
)

// EndForAbuse ends sb for verdict v with reason (node.ReasonAbuse when
// the detector decided from its samples; node.ReasonPidsLimit when the
// sandbox stopped at its host pids limit) and the verdict as the detail,
// so that later calls get 410 with it; it flags the tenant and records
// both, once per sandbox however many callers saw it. It returns when the
// teardown is over (a failed one is logged).
func (mon *Monitor) EndForAbuse(sb Sandbox, v abuse.Verdict, reason string) {
	first := sb.ClaimAbuse()
	rec := sb.Record()
	ctx := context.Background()
	if first {
		mon.log.Warn("abuse: ending session", "session", sb.ID(), "tenant", rec.Tenant, "pattern", v.Pattern, "reason", v.Reason)
	}
	if err := mon.opts.Core.End(ctx, sb, reason, v.Reason); err != nil {
		mon.log.Error("abuse: end session", "session", sb.ID(), "err", err)
	}
	// Flagged and recorded once (the monitor and a call may both have
	// seen it), and never for a warm-pool member: nobody's.
	if !first || rec.Tenant == "" {
		return
	}
	mon.opts.Metrics.AbuseKill(v.Pattern)
	if err := mon.opts.Store.FlagTenant(ctx, rec.Tenant, v.Pattern+": "+v.Reason+" (session "+sb.ID()+")", time.Now()); err != nil {
		mon.log.Error("abuse: flag tenant", "tenant", rec.Tenant, "err", err)
	}
	mon.opts.Audit.Record(ctx, audit.Event{Tenant: rec.Tenant, Session: sb.ID(), Kind: "abuse", Outcome: audit.Denied,
		Detail: map[string]any{"pattern": v.Pattern, "reason": v.Reason, "session_reason": reason, "action": "ended; tenant flagged"}})
}

// endForBudget ends every running or paused session of tenant, which
// used usedMS CPU-milliseconds today against a budget of budgetS
// CPU-seconds (reason quota), without waiting for the teardowns.
func (mon *Monitor) endForBudget(tenant string, usedMS, budgetS int64) {
	victims := mon.opts.Core.Live(tenant)
	if len(victims) == 0 {
		return
	}
	detail := fmt.Sprintf("the tenant's CPU budget for today is used up (%.1f of %d CPU-seconds)", float64(usedMS)/1000, budgetS)
	mon.log.Warn("CPU budget used up: ending the tenant's sessions", "tenant", tenant, "sessions", len(victims))
	mon.opts.Audit.Record(context.Background(), audit.Event{Tenant: tenant, Kind: "policy", Outcome: audit.Denied,
		Detail: map[string]any{"rule": node.ProblemCPUBudgetExhausted, "error": detail, "sessions_ended": len(victims)}})
	for _, sb := range victims {
		go func() {
			if err := mon.opts.Core.End(context.Background(), sb, node.ReasonQuota, detail); err != nil {
				mon.log.Error("end session for CPU budget", "session", sb.ID(), "err", err)
			}
		}()
	}
}
