package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Operations measured. Rows of the report carry one of these names.
const (
	// OpRun is a whole run of `true` to completion: forkbox create + exec +
	// destroy, `runc run`, `podman run --rm`.
	OpRun = "run true to completion"
	// OpCreate is forkbox's POST /v1/sessions until the agent answered,
	// with no warm pool for it (a cold create).
	OpCreate = "create"
	// OpExec is one exec of `true` in a running sandbox or container.
	OpExec = "exec true"
	// OpDestroy is forkbox's DELETE /v1/sessions/{id}.
	OpDestroy = "destroy"
	// OpPause freezes a running sandbox or container: forkbox's POST
	// /v1/sessions/{id}/pause, `runc pause`, `podman pause`.
	OpPause = "pause"
	// OpResume thaws a paused one: forkbox's resume, `runc resume`,
	// `podman unpause`.
	OpResume = "resume"
	// OpPoolCreate is forkbox's POST /v1/sessions answered by a ready
	// member of a warm pool (only creates that took one are counted).
	OpPoolCreate = "create from a warm pool"
	// OpSnapshot is a filesystem snapshot of a sandbox that wrote
	// Result.DataMB MB: forkbox's POST /v1/sessions/{id}/snapshot,
	// `podman commit`, and a plain copy of as much data for reference.
	OpSnapshot = "snapshot"
	// OpSnapshotUnsynced is forkbox's snapshot of a sandbox right after it
	// wrote Result.DataMB MB without syncing them (freeze.go).
	OpSnapshotUnsynced = "snapshot right after an unsynced write"
	// OpFrozenUnsynced is how long that snapshot stalled the sandbox: the
	// longest gap of a process inside that wakes every millisecond.
	OpFrozenUnsynced = "sandbox frozen by it"
	// OpFrozenSynced is the same stall for a snapshot taken after a sync
	// of that write.
	OpFrozenSynced = "sandbox frozen by a snapshot after sync"
	// OpFork is forkbox's POST /v1/snapshots/{id}/fork of forkCount
	// sessions from a files snapshot of a session that wrote
	// Result.DataMB, until every child answered an exec of `true`; beside
	// it the runc CLI starting as many containers at once until each
	// answered `runc exec`.
	OpFork = "fork 8 from a snapshot"
	// OpFork64 is the same with fork64Count sessions.
	OpFork64 = "fork 64 from a snapshot"
	// OpRestoreFiles is one session created from such a snapshot
	// (POST /v1/sessions {snapshot}) until it answered an exec of `true`;
	// beside it one runc container until it answered `runc exec`.
	OpRestoreFiles = "create from a files snapshot"
	// OpSustained is create → exec `true` → destroy run by Clients
	// clients at once for a fixed time (Result.PerSecond is the rate);
	// beside it `runc run` of /bin/true the same way.
	OpSustained = "create + exec + destroy, sustained"
	// OpGVisorExec is one exec of `true` in a gVisor sandbox: through
	// forkbox's agent, or `runsc exec`.
	OpGVisorExec = "gVisor: exec true"
	// OpMemSnapshot is a memory snapshot of a gVisor sandbox in which a
	// process holds Result.DataMB MB: forkbox's POST
	// /v1/sessions/{id}/snapshot {memory: true} (checkpoint, files, sealing),
	// `runsc checkpoint --leave-running`.
	OpMemSnapshot = "gVisor: memory snapshot"
	// OpMemRestore is a session started from such a snapshot until its
	// agent answers (forkbox: verify, decrypt, restore, new hostname), or
	// `runsc restore --detach`.
	OpMemRestore = "gVisor: restore a memory snapshot"
	// OpMemFork is forkbox's POST /v1/snapshots/{id}/fork of
	// gvisorForkCount sessions from a memory snapshot, the whole call; or
	// as many `runsc restore --detach` at once.
	OpMemFork = "gVisor: fork 5 from a memory snapshot"
)

// Systems measured.
const (
	SystemForkbox = "forkbox"
	SystemRunc    = "runc"
	SystemPodman  = "podman"
	// SystemRunsc is the runsc (gVisor) CLI.
	SystemRunsc = "runsc"
	// SystemCopy is a plain copy of a file (cp), a reference for snapshots.
	SystemCopy = "plain cp"
)

// opOrder is the order in which operations appear in the table (the
// operations it does not name follow, in the order they were measured).
var opOrder = []string{OpFork, OpFork64, OpPoolCreate, OpCreate, OpRestoreFiles, OpExec, OpSustained,
	OpRun, OpDestroy, OpPause, OpResume, OpSnapshot,
	OpSnapshotUnsynced, OpFrozenUnsynced, OpFrozenSynced,
	OpMemSnapshot, OpMemRestore, OpMemFork, OpGVisorExec, OpCodeWarm, OpCodeFirst, OpCodeFirstCold, OpCodeChart,
	OpPullCold, OpPullCached, OpBuildCold, OpBuildCached, OpBuildFirst}

// systemOrder is the order of systems within one operation.
var systemOrder = []string{SystemForkbox, SystemRouted, SystemRunc, SystemRunsc, SystemPodman, SystemCopy, SystemPythonExec}

// targets are the p50 targets for forkbox rows, in milliseconds, by
// operation: the fork, restore and create performance work's table
// (p50 on a 2-core machine), and DESIGN.md section 6 for the rest.
var targets = map[string]float64{
	OpFork:         80,   // fork of 8 children from a files snapshot, in all, every child answering exec
	OpFork64:       1000, // fork of 64, in all
	OpPoolCreate:   3,    // sandbox ready from a warm pool
	OpCreate:       60,   // cold create, runc tier
	OpRestoreFiles: 10,   // create from a files snapshot
	OpExec:         3,    // exec round trip of `true` through the agent, runc tier
	OpPause:        10,   // freezer
	OpResume:       10,   // freezer
	OpSnapshot:     50,   // filesystem snapshot with 500 MB written, on btrfs
	OpGVisorExec:   25,   // exec round trip of `true` through the agent, gVisor
	OpMemSnapshot:  250,  // gVisor memory snapshot of a 100 MB sandbox
	OpMemRestore:   300,  // its restore into a new session, agent answering
	OpMemFork:      1500, // fork of 5 children from it, in all
	OpCodeWarm:     10,   // runCode('1+1') round trip in a warm kernel, runc tier (issue 17)
	OpCodeFirst:    300,  // the first runCode after create (issue 17)
	OpBuildCached:  200,  // a fully cached rebuild of a Dockerfile (issue 19)
}

// rateTargets are the lowest acceptable rates, in operations a second,
// for the throughput rows.
var rateTargets = map[string]float64{
	OpSustained: 50, // create → exec → destroy, 4 clients, 2 cores
}

// idleCPUTargetPct is the most idle CPU a gVisor sandbox may take, in
// percent of one core.
const idleCPUTargetPct = 0.5

// btrfsTargets are the targets given for btrfs storage only; forkbox rows
// measured on other storage show them as a note.
var btrfsTargets = map[string]bool{OpSnapshot: true, OpFork: true, OpFork64: true, OpRestoreFiles: true}

// Target is a performance target and whether this run met it.
type Target struct {
	// P50MS is the highest acceptable median, in milliseconds (0 for a
	// rate target).
	P50MS float64 `json:"p50_ms,omitempty"`
	// MinPerSecond is the lowest acceptable rate, in operations a second
	// (0 for a latency target).
	MinPerSecond float64 `json:"min_per_s,omitempty"`
	// Met reports whether the run met it.
	Met bool `json:"met"`
}

// Result is one row of the report: one operation on one system.
type Result struct {
	// Operation is one of the Op constants.
	Operation string `json:"operation"`
	// System is one of the System constants.
	System string `json:"system"`
	// DataMB is how many MB (10^6 bytes) the sandbox had written (or, for
	// the memory rows, held) before the operation, 0 otherwise.
	DataMB int `json:"data_mb,omitempty"`
	// N is the number of measured iterations (warm-ups excluded).
	N int `json:"n"`
	// P50MS and P99MS are nearest-rank percentiles, in milliseconds.
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	// MeanMS is the arithmetic mean, in milliseconds.
	MeanMS float64 `json:"mean_ms"`
	// PerSecond is the rate of a throughput row, in operations a second.
	PerSecond *float64 `json:"per_s,omitempty"`
	// PairedRatio is set on peer rows measured interleaved with forkbox:
	// the median over the rounds of this system's time divided by
	// forkbox's in the same round (above 1: forkbox is faster). Pairs is
	// how many rounds it was taken over.
	PairedRatio *float64 `json:"paired_ratio,omitempty"`
	Pairs       int      `json:"pairs,omitempty"`
	// Target is set on forkbox rows that have a target.
	Target *Target `json:"target,omitempty"`
	// Note says why a row has no numbers or how to read it.
	Note string `json:"note,omitempty"`
	// Error is why the operation could not be measured; N is 0 then.
	Error string `json:"error,omitempty"`
}

// Report is the outcome of Run.
type Report struct {
	// N is the number of measured iterations per operation.
	N int `json:"n"`
	// Warmup is the number of uncounted iterations run before them.
	Warmup int `json:"warmup"`
	// Started is when the run began.
	Started time.Time `json:"started"`
	// Groups are the row groups that were run.
	Groups []string `json:"groups"`
	// Versions describes each system measured (binary versions, the
	// daemon's address or data directory).
	Versions map[string]string `json:"versions"`
	// Storage is the forkbox storage driver the snapshots were taken on
	// (btrfs or overlay; "" when none was taken).
	Storage string `json:"storage,omitempty"`
	// Results has one row per operation and system.
	Results []Result `json:"results"`
	// Idle has the idle rows, one per tier.
	Idle []IdleResult `json:"idle,omitempty"`
}

// newResult summarises samples into a row; a non-nil err makes it an
// error row without numbers.
func newResult(op, system string, samples []time.Duration, err error) Result {
	r := Result{Operation: op, System: system}
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.N, r.P50MS, r.P99MS, r.MeanMS = summarize(samples)
	return r
}

// skipped returns a row for an operation that was not run, saying why.
func skipped(op, system, why string) Result {
	return Result{Operation: op, System: system, Note: "skipped: " + why}
}

// summarize returns the count and the nearest-rank p50, nearest-rank p99
// and mean of samples, in milliseconds rounded to 2 decimals.
func summarize(samples []time.Duration) (n int, p50, p99, mean float64) {
	if len(samples) == 0 {
		return 0, 0, 0, 0
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	return len(sorted), ms(percentile(sorted, 50)), ms(percentile(sorted, 99)),
		ms(sum / time.Duration(len(sorted)))
}

// percentile returns the nearest-rank pct-th percentile (0 < pct <= 100)
// of sorted, which must be sorted ascending and not empty: the smallest
// sample such that at least pct percent of the samples are at most it.
func percentile(sorted []time.Duration, pct int) time.Duration {
	rank := (pct*len(sorted) + 99) / 100 // ceil(pct/100 * n), in integers
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

// ms converts d to milliseconds rounded to 2 decimals.
func ms(d time.Duration) float64 { return round2(float64(d) / float64(time.Millisecond)) }

// round2 rounds x to 2 decimals.
func round2(x float64) float64 { return math.Round(x*100) / 100 }

// sysRank is system's place in systemOrder; a system it does not name
// (a group's own reference, as "same server on the host") comes after.
func sysRank(system string) int {
	if i := slices.Index(systemOrder, system); i >= 0 {
		return i
	}
	return len(systemOrder)
}

// finish sorts the rows and sets the targets and notes of forkbox rows.
func (r *Report) finish() {
	// Operations opOrder does not name follow it, in the order they were
	// first measured, each kept together.
	rank := map[string]int{}
	for i, op := range opOrder {
		rank[op] = i
	}
	for _, res := range r.Results {
		if _, ok := rank[res.Operation]; !ok {
			rank[res.Operation] = len(rank)
		}
	}
	slices.SortStableFunc(r.Results, func(a, b Result) int {
		if c := rank[a.Operation] - rank[b.Operation]; c != 0 {
			return c
		}
		return sysRank(a.System) - sysRank(b.System)
	})
	base := map[string]float64{}
	for _, res := range r.Results {
		if res.System == SystemForkbox && res.Error == "" && res.N > 0 && res.P50MS > 0 {
			base[res.Operation] = res.P50MS
		}
	}
	for i := range r.Results {
		res := &r.Results[i]
		if res.System == SystemForkbox && res.Error == "" && res.N > 0 {
			r.finishForkbox(res, base)
		}
	}
}

// finishForkbox sets the target of forkbox row res and the notes that
// relate it to other forkbox rows (base: forkbox p50 by operation).
func (r *Report) finishForkbox(res *Result, base map[string]float64) {
	var notes []string
	switch res.Operation {
	case OpFork:
		notes = append(notes, fmt.Sprintf("%.2f ms per session (p50/%d)", res.P50MS/forkCount, forkCount))
	case OpFork64:
		notes = append(notes, fmt.Sprintf("%.2f ms per session (p50/%d)", res.P50MS/fork64Count, fork64Count))
	case OpPoolCreate:
		if cold, ok := base[OpCreate]; ok && res.P50MS > 0 {
			notes = append(notes, fmt.Sprintf("cold create p50 %.2f ms = %.1fx", cold, cold/res.P50MS))
		}
	}
	if limit, ok := targets[res.Operation]; ok {
		if btrfsTargets[res.Operation] && r.Storage != "btrfs" {
			notes = append(notes, fmt.Sprintf("target p50 <= %g ms is for btrfs (storage: %s)", limit, orUnknown(r.Storage)))
		} else {
			res.Target = &Target{P50MS: limit, Met: res.P50MS <= limit}
		}
	}
	if limit, ok := rateTargets[res.Operation]; ok && res.PerSecond != nil {
		res.Target = &Target{MinPerSecond: limit, Met: *res.PerSecond >= limit}
	}
	if res.Note != "" {
		notes = append(notes, res.Note)
	}
	res.Note = strings.Join(notes, "; ")
}

// orUnknown returns s, or "unknown" when it is empty.
func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// ForkboxErr returns an error when a forkbox row could not be measured,
// nil otherwise (peer failures are only reported in their rows).
func (r *Report) ForkboxErr() error {
	var failed []string
	for _, res := range r.Results {
		// A routed call is forkbox's too (the route rows).
		if (res.System == SystemForkbox || res.System == SystemRouted) && res.Error != "" {
			failed = append(failed, res.Operation+" ("+res.System+"): "+res.Error)
		}
	}
	for _, idle := range r.Idle {
		if idle.Error != "" && idle.Sandboxes > 0 && !strings.Contains(idle.Error, "no gvisor driver") {
			failed = append(failed, "idle "+idle.Isolation+": "+idle.Error)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("forkbox benchmark failed: %s", strings.Join(failed, "; "))
	}
	return nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
