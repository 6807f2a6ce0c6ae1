// Package monitor watches a host's running sessions from outside them:
// each abuse interval it samples every one through its runtime driver
// (runtime.Sampler, else Stats), adds the CPU each used to its tenant's
// day (ending the tenant's sessions when its budget is used up), feeds
// the abuse detector (ending the session and flagging its tenant on a
// verdict), and ends sessions whose sandbox died by itself. Each round's
// duration is a metric.
//
// The monitor depends on the lifecycle core only through Core, which the
// core implements and hands to New; the core calls the monitor back
// (CountCPU, EndForAbuse, Detector), so imports run one way: the core
// imports monitor, never the reverse.
package monitor

import (
	"context"
	"log/slog"
	"time"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/metrics"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/store"
)

// processListInterval is how often, at most, the monitor lists one
// sandbox's processes for the mining check (listing a gVisor sandbox's
// starts a runsc process). A mining signal counts for the detector's
// whole window, so a miner is still caught within it.
const processListInterval = 15 * time.Second

// Sandbox is one live sandbox as the core hands it to the monitor.
type Sandbox interface {
	// ID is its session id.
	ID() string
	// Record returns a copy of its current record.
	Record() node.Session
	// ClaimAbuse marks the sandbox as being ended for abuse and reports
	// whether this call was the first to (the mark stays for the
	// sandbox's life), so that its tenant is flagged once.
	ClaimAbuse() bool
}

// Core is what the monitor needs of the lifecycle core.
type Core interface {
	// Running lists the sandboxes to sample: running, with no teardown
	// under way, owned by a tenant (not warm-pool members).
	Running() []Sandbox
	// Live lists tenant's running or paused sandboxes.
	Live(tenant string) []Sandbox
	// Driver returns the runtime driver sb runs on.
	Driver(sb Sandbox) runtime.Driver
	// End tears sb down with reason (a node.Reason*) and detail, and
	// returns once it is terminated (nil) or the teardown failed.
	End(ctx context.Context, sb Sandbox, reason, detail string) error
	// CheckDead ends sandbox id, with the reason its runtime gives, when
	// it stopped by itself; nil when it still runs.
	CheckDead(ctx context.Context, id string) error
}

// Options configure a Monitor.
type Options struct {
	// Core lists and ends the host's sandboxes.
	Core Core
	// Admission gives each tenant's policy (its CPU budget).
	Admission *admission.Controller
	// Store counts CPU use and flags tenants.
	Store *store.Store
	// Audit records abuse kills and budget ends; nil records nothing.
	Audit *audit.Recorder
	// Metrics counts rounds and kills; nil counts nothing.
	Metrics *metrics.Set
	// Abuse tunes the abuse detector (zero: abuse.DefaultConfig).
	Abuse abuse.Config
	// Log receives the monitor's warnings; nil: slog.Default().
	Log *slog.Logger
}

// Monitor samples a host's running sessions. Safe for concurrent use;
// Run runs its rounds.
type Monitor struct {
	opts     Options
	log      *slog.Logger
	detector *abuse.Detector
	// listed holds when each sandbox's processes were listed last (kept
	// from round to round; only Run's goroutine uses it).
	listed map[string]time.Time
	// history keeps each session's recent samples (history.go).
	history *history
}

// New returns a monitor with opts; it samples nothing until Run.
func New(opts Options) *Monitor {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	return &Monitor{opts: opts, log: log, detector: abuse.New(opts.Abuse), listed: map[string]time.Time{},
		history: newHistory()}
}

// Detector returns the abuse detector the monitor feeds, for the core's
// own signals (egress events, a sandbox stopped at its pids limit) and
// for forgetting a sandbox that ended.
func (mon *Monitor) Detector() *abuse.Detector { return mon.detector }

// Run takes one round of samples each detector interval until stop is
// closed. A round's duration is a metric; one that ran out of its
// interval, or took longer, counts as an overrun.
func (mon *Monitor) Run(stop <-chan struct{}) {
	interval := mon.detector.Config().Interval
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		start := time.Now()
		finished := mon.round()
		took := time.Since(start)
		mon.opts.Metrics.ObserveMonitorRound(took, !finished || took > interval)
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
func (mon *Monitor) sample(ctx context.Context, sb Sandbox) (runtime.Stats, error) {
	drv := mon.opts.Core.Driver(sb)
	var st runtime.Stats
	var err error
	if s, ok := drv.(runtime.Sampler); ok {
		st, err = s.Sample(ctx, sb.ID())
		if limit := sb.Record().Pids; err == nil && limit > 0 && st.Pids >= limit {
			if full, ferr := drv.Stats(ctx, sb.ID()); ferr == nil {
				st.Pids, st.PidsLimit = full.Pids, limit
				st.PidsLimitHits = max(st.PidsLimitHits, full.PidsLimitHits)
			}
		}
	} else {
		st, err = drv.Stats(ctx, sb.ID())
	}
	if err == nil && st.ReadAt.IsZero() {
		st.ReadAt = time.Now()
	}
	return st, err
}

// CountCPU reads sb's CPU time from the host and adds what it used since
// the last reading to its tenant's day; the core calls it for the last
// reading, before the sandbox's cgroup goes. Warm-pool members count for
// nobody. A failed reading counts nothing; a failed write is logged.
func (mon *Monitor) CountCPU(ctx context.Context, sb Sandbox) {
	rec := sb.Record()
	if rec.Tenant == "" || rec.State == node.StatePooled {
		return
	}
	st, err := mon.sample(ctx, sb)
	if err != nil {
		return
	}
	if _, err := mon.opts.Store.AddSessionCPU(ctx, sb.ID(), rec.Tenant, int64(st.CPUSeconds*1000), st.ReadAt); err != nil {
		mon.log.Warn("count session CPU", "session", sb.ID(), "tenant", rec.Tenant, "err", err)
	}
}

// ClearCPU records the CPU time sb used so far as counted, for nobody:
// a warm-pool member that a tenant claims is charged to the tenant only
// from then on. A failed reading or write leaves it uncounted.
func (mon *Monitor) ClearCPU(ctx context.Context, sb Sandbox) {
	if st, err := mon.sample(ctx, sb); err == nil {
		_, _ = mon.opts.Store.AddSessionCPU(ctx, sb.ID(), "", int64(st.CPUSeconds*1000), time.Now())
	}
}
