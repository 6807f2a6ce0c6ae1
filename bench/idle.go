package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/datadir"
)

// The idle rows: what sandboxes that do nothing cost the host. N idle
// sessions of a tier are created at once (in parallel, closeParallel at a
// time), left to settle, and then:
//
//   - memory per sandbox, two ways: the host's MemAvailable before minus
//     after, over N (every process on the host moves it: a figure for a
//     quiet machine), and the growth of the sessions' memory cgroups plus
//     the private daemon's RSS growth, over N;
//   - CPU per sandbox over IdleWindow: the sessions' cgroup CPU time plus
//     the private daemon's own (with the helper processes it waited for,
//     such as runsc events), over N, as a percentage of one core; the
//     host's busy time over the same window (/proc/stat, every process on
//     the host) is given beside it; and for gVisor the CPU and PSS of the
//     runsc processes (Sentry, gofer) found by their command line, a check
//     that the cgroup figures include them (the Sentry and the gofer run
//     in the sandbox's cgroups).
//
// For a private daemon the cgroup figures are read from the daemon's
// cgroup parent (cgroup v1 cpuacct and memory hierarchies), which holds
// every sandbox of the daemon and nothing else; for a daemon at a URL
// they are the sum of GET /v1/sessions/{id}/usage, whose CPU figure the
// daemon samples (so it may lag the window).
//
// Every session is destroyed at the end, also on error or cancellation.

// Defaults for the idle rows.
const (
	// DefaultIdleRunc is how many idle runc sessions the idle row holds.
	DefaultIdleRunc = 50
	// DefaultIdleGVisor is how many idle gVisor sessions it holds.
	DefaultIdleGVisor = 10
	// DefaultIdleWindow is how long idle CPU is measured.
	DefaultIdleWindow = 10 * time.Second
)

// idleSettle is how long the sessions are left alone after the last
// create before anything is measured (start-up work ending).
const idleSettle = 3 * time.Second

// idleTimeoutS is the timeout of idle sessions: long enough that none
// ends while a thousand are created and measured.
const idleTimeoutS = 3600

// IdleResult is the idle cost of one tier's sandboxes.
type IdleResult struct {
	// Isolation is the tier: "runc" or "gvisor".
	Isolation string `json:"isolation"`
	// Sandboxes is how many idle sessions were held at once.
	Sandboxes int `json:"sandboxes"`
	// CreateS and DestroyS are how long creating and destroying all of
	// them took, in seconds (closeParallel at a time).
	CreateS  float64 `json:"create_s"`
	DestroyS float64 `json:"destroy_s"`
	// HostMemMiBPer is MemAvailable before minus after, over Sandboxes,
	// in MiB (2^20 bytes).
	HostMemMiBPer float64 `json:"host_mem_mib_per_sandbox"`
	// CgroupMemMiBPer is the growth of the sessions' memory cgroups plus
	// the private daemon's RSS growth, over Sandboxes, in MiB.
	CgroupMemMiBPer float64 `json:"cgroup_mem_mib_per_sandbox"`
	// DaemonRSSMiB is the private daemon's RSS growth in all, in MiB
	// (0 for a daemon measured at a URL: not known).
	DaemonRSSMiB float64 `json:"daemon_rss_delta_mib"`
	// WindowS is how long CPU was measured, in seconds.
	WindowS float64 `json:"window_s"`
	// CPUPctPer is the sessions' cgroup CPU plus the private daemon's
	// over the window, over Sandboxes, in percent of one core.
	CPUPctPer float64 `json:"cpu_pct_per_sandbox"`
	// DaemonCPUPct is the private daemon's part of that in all (not per
	// sandbox), percent of one core.
	DaemonCPUPct float64 `json:"daemon_cpu_pct"`
	// HostCPUPct is the whole host's busy time over the window (any
	// process, other work included), percent of one core.
	HostCPUPct float64 `json:"host_cpu_pct"`
	// RuntimeProcs, RuntimeCPUPctPer and RuntimePSSMiBPer describe the
	// runsc processes of the private daemon's sandboxes (gVisor only): how
	// many, their CPU over the window and their proportional set size, per
	// sandbox (included in the cgroup figures: a cross-check).
	RuntimeProcs     int     `json:"runtime_procs,omitempty"`
	RuntimeCPUPctPer float64 `json:"runtime_cpu_pct_per_sandbox,omitempty"`
	RuntimePSSMiBPer float64 `json:"runtime_pss_mib_per_sandbox,omitempty"`
	// Note says how to read the row; Error why it could not be measured.
	Note  string `json:"note,omitempty"`
	Error string `json:"error,omitempty"`
}

// measureIdle measures the idle rows of the runc tier and, when the
// daemon has it, of the gVisor tier; they go into e.idle.
func (e *env) measureIdle(ctx context.Context) []Result {
	e.idle = append(e.idle, e.fb.idle(ctx, "runc", e.opts.IdleRunc))
	if e.fb.hasDriver(ctx, driverGVisor) {
		e.idle = append(e.idle, e.fb.idle(ctx, driverGVisor, e.opts.IdleGVisor))
	} else {
		e.idle = append(e.idle, IdleResult{Isolation: driverGVisor, Error: "the daemon has no gvisor driver"})
	}
	return nil
}

// idle holds n idle sessions of isolation and measures them (see above).
func (f *forkbox) idle(ctx context.Context, isolation string, n int) (res IdleResult) {
	res = IdleResult{Isolation: isolation, Sandboxes: n, WindowS: f.opts.IdleWindow.Seconds()}
	if n <= 0 {
		res.Error = "no sandboxes asked for"
		return res
	}
	info, err := f.c.Info(ctx)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	// The smallest sandbox the daemon allows: its idle cost does not
	// depend on its limits, and a thousand fit in the host's capacity.
	req := client.CreateRequest{Isolation: isolation, MemoryMB: info.Limits.MinMemoryMB,
		DiskMB: info.Limits.MinDiskMB, TimeoutS: min(idleTimeoutS, max(info.Limits.MaxTimeoutS, 0))}
	if req.TimeoutS == 0 {
		req.TimeoutS = idleTimeoutS
	}
	memBefore, err := memAvailable()
	if err != nil {
		res.Error = err.Error()
		return res
	}
	rssBefore := f.daemonRSS()
	cgBefore, _ := f.cgroupTotals(ctx, nil)

	f.opts.progressf("idle %s: create %d sessions, %d at a time", isolation, n, closeParallel)
	ids := make([]string, n)
	errs := make([]error, n)
	start := time.Now()
	sem := make(chan struct{}, closeParallel)
	var wg sync.WaitGroup
	for i := range n {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s, _, err := f.createWith(ctx, req)
			if err != nil {
				errs[i] = err
				return
			}
			ids[i] = s.ID
		}()
	}
	wg.Wait()
	res.CreateS = round2(time.Since(start).Seconds())
	var live []string
	for _, id := range ids {
		if id != "" {
			live = append(live, id)
		}
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout+time.Duration(len(live))*perSessionCleanup)
		defer cancel()
		f.opts.progressf("idle %s: destroy %d sessions", isolation, len(live))
		d, err := timed(func() error { return f.destroyAll(dctx, live) })
		res.DestroyS = round2(d.Seconds())
		if err != nil && res.Error == "" {
			res.Error = "destroy: " + oneLine(err.Error(), 300)
		}
	}()
	if err := errors.Join(errs...); err != nil {
		res.Error = fmt.Sprintf("%d of %d creates failed: %s", n-len(live), n, oneLine(err.Error(), 300))
		return res
	}

	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		res.Error = ctx.Err().Error()
		return res
	}
	memAfter, err := memAvailable()
	if err != nil {
		res.Error = err.Error()
		return res
	}
	rssAfter := f.daemonRSS()
	cg0, err := f.cgroupTotals(ctx, live)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.HostMemMiBPer = round2(float64(memBefore-memAfter) / float64(n) / (1 << 20))
	if f.d != nil {
		res.DaemonRSSMiB = round2(float64(rssAfter-rssBefore) / (1 << 20))
	}
	res.CgroupMemMiBPer = round2((float64(cg0.memory-cgBefore.memory) + float64(max(0, rssAfter-rssBefore))) / float64(n) / (1 << 20))

	f.opts.progressf("idle %s: CPU over %s", isolation, f.opts.IdleWindow)
	host0, hostErr := hostBusy()
	self0 := selfCPU()
	rt0 := runtimeProcs(f.dataDir, isolation)
	t0 := time.Now()
	select {
	case <-time.After(f.opts.IdleWindow):
	case <-ctx.Done():
		res.Error = ctx.Err().Error()
		return res
	}
	window := time.Since(t0).Seconds()
	host1, _ := hostBusy()
	self1 := selfCPU()
	rt1 := runtimeProcs(f.dataDir, isolation)
	cg1, err := f.cgroupTotals(ctx, live)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	pct := func(cpuSeconds float64) float64 { return 100 * cpuSeconds / window }
	res.WindowS = round2(window)
	daemonCPU := 0.0
	if f.d != nil {
		daemonCPU = self1 - self0
		res.DaemonCPUPct = round2(pct(daemonCPU))
	}
	res.CPUPctPer = round3(pct(cg1.cpu-cg0.cpu+daemonCPU) / float64(n))
	if hostErr == nil {
		res.HostCPUPct = round2(pct(host1 - host0))
	}
	if len(rt1.cpu) > 0 {
		var cpu float64
		for pid, c := range rt1.cpu {
			cpu += c - rt0.cpu[pid] // a process that started in the window counts from 0
		}
		res.RuntimeProcs = len(rt1.cpu)
		res.RuntimeCPUPctPer = round3(pct(cpu) / float64(n))
		res.RuntimePSSMiBPer = round2(float64(rt1.pss) / float64(n) / (1 << 20))
	}
	if f.d == nil {
		res.Note = "daemon at a URL: cgroups from its usage API (CPU sampled), its own RSS and CPU not counted"
	}
	return res
}

// usageSum is the sum of sessions' usage.
type usageSum struct {
	cpu    float64 // CPU-seconds
	memory int64   // bytes
}

// usage sums the usage of sessions ids, closeParallel calls at a time.
func (f *forkbox) usage(ctx context.Context, ids []string) (usageSum, error) {
	var mu sync.Mutex
	var sum usageSum
	var first error
	sem := make(chan struct{}, closeParallel)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			u, err := f.c.Usage(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = fmt.Errorf("usage of %s: %w", id, err)
				}
				return
			}
			sum.cpu += u.CPUSeconds
			sum.memory += u.MemoryBytes
		}()
	}
	wg.Wait()
	return sum, first
}

// cgroupTotals returns the CPU time and memory of the daemon's
// sandboxes: for a private daemon, its cgroup parent's (every sandbox,
// ids not needed); otherwise the sum of ids' usage.
func (f *forkbox) cgroupTotals(ctx context.Context, ids []string) (usageSum, error) {
	if f.d == nil {
		return f.usage(ctx, ids)
	}
	layout, err := datadir.New(f.dataDir)
	if err != nil {
		return usageSum{}, err
	}
	parent := layout.HostNames().CgroupParent
	cpuNS, err := readCgroupInt("cpuacct", parent, "cpuacct.usage")
	if err != nil {
		return usageSum{}, err
	}
	mem, err := readCgroupInt("memory", parent, "memory.usage_in_bytes")
	if err != nil {
		return usageSum{}, err
	}
	return usageSum{cpu: float64(cpuNS) / 1e9, memory: mem}, nil
}

// daemonRSS returns the private daemon's resident memory in bytes (it runs
// in this process), 0 for a daemon at a URL or when it cannot be read.
func (f *forkbox) daemonRSS() int64 {
	if f.d == nil {
		return 0
	}
	return procRSS("self")
}
