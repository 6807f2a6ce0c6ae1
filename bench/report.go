package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Operations measured. Rows of the report carry one of these names.
const (
	// OpRun is a whole run of `true` to completion: forkbox create + exec +
	// destroy, `runc run`, `podman run --rm`.
	OpRun = "run true to completion"
	// OpCreate is forkbox's POST /v1/sessions until the agent answered.
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
	// sessions from such a snapshot, the whole call.
	OpFork = "fork 8 from a snapshot"
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
	// gvisorForkCount sessions from a memory snapshot, the whole call.
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

// opOrder is the order in which operations appear in the table.
var opOrder = []string{OpRun, OpCreate, OpPoolCreate, OpExec, OpDestroy, OpPause, OpResume, OpSnapshot, OpFork,
	OpSnapshotUnsynced, OpFrozenUnsynced, OpFrozenSynced,
	OpGVisorExec, OpMemSnapshot, OpMemRestore, OpMemFork}

// systemOrder is the order of systems within one operation.
var systemOrder = []string{SystemForkbox, SystemRunc, SystemRunsc, SystemPodman, SystemCopy}

// comparable lists the operations whose peer rows get a ratio to forkbox.
var comparable = map[string]bool{OpRun: true, OpExec: true, OpPause: true, OpResume: true, OpSnapshot: true,
	OpGVisorExec: true, OpMemSnapshot: true, OpMemRestore: true}

// targets are the p50 targets of DESIGN.md section 6 for forkbox rows, in
// milliseconds, by operation.
var targets = map[string]float64{
	OpCreate:      60,  // cold create, runc tier
	OpPoolCreate:  5,   // sandbox ready from a warm pool
	OpExec:        3,   // exec round trip of `true` through the agent, runc tier
	OpPause:       10,  // freezer
	OpResume:      10,  // freezer
	OpSnapshot:    50,  // filesystem snapshot with 500 MB written, on btrfs
	OpFork:        100, // fork of 8 children from it, in all, on btrfs
	OpGVisorExec:  25,  // exec round trip of `true` through the agent, gVisor
	OpMemSnapshot: 500, // gVisor memory snapshot of a 100 MB sandbox
	OpMemRestore:  500, // and its restore
	OpMemFork:     600, // fork of 5 children from it, in all (the target)
}

// btrfsTargets are the targets DESIGN.md gives for btrfs storage only;
// forkbox rows measured on other storage show them as a note.
var btrfsTargets = map[string]bool{OpSnapshot: true, OpFork: true}

// Target is a performance target from DESIGN.md section 6 and whether this
// run met it.
type Target struct {
	// P50MS is the highest acceptable median, in milliseconds.
	P50MS float64 `json:"p50_ms"`
	// Met reports whether the measured p50 is at most P50MS.
	Met bool `json:"met"`
}

// Result is one row of the report: one operation on one system.
type Result struct {
	// Operation is one of the Op constants.
	Operation string `json:"operation"`
	// System is one of the System constants.
	System string `json:"system"`
	// DataMB is how many MB (10^6 bytes) the sandbox had written before the
	// operation (snapshot and fork rows), 0 otherwise.
	DataMB int `json:"data_mb,omitempty"`
	// N is the number of measured iterations (warm-ups excluded).
	N int `json:"n"`
	// P50MS and P99MS are nearest-rank percentiles, in milliseconds.
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	// MeanMS is the arithmetic mean, in milliseconds.
	MeanMS float64 `json:"mean_ms"`
	// VsForkbox is this row's p50 divided by forkbox's p50 for the same
	// operation (greater than 1: forkbox is faster); nil when not comparable.
	VsForkbox *float64 `json:"vs_forkbox,omitempty"`
	// Target is set on forkbox rows that DESIGN.md section 6 gives a target.
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
	// Versions describes each system measured (binary versions, the
	// daemon's address or data directory).
	Versions map[string]string `json:"versions"`
	// Storage is the forkbox storage driver the snapshots were taken on
	// (btrfs or overlay; "" when none was taken).
	Storage string `json:"storage,omitempty"`
	// Results has one row per operation and system.
	Results []Result `json:"results"`
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

// finish sorts the rows and fills in the ratios to forkbox, the targets of
// forkbox rows and the notes of reference-only rows.
func (r *Report) finish() {
	slices.SortStableFunc(r.Results, func(a, b Result) int {
		if c := slices.Index(opOrder, a.Operation) - slices.Index(opOrder, b.Operation); c != 0 {
			return c
		}
		return slices.Index(systemOrder, a.System) - slices.Index(systemOrder, b.System)
	})
	base := map[string]float64{}
	for _, res := range r.Results {
		if res.System == SystemForkbox && res.Error == "" && res.N > 0 && res.P50MS > 0 {
			base[res.Operation] = res.P50MS
		}
	}
	for i := range r.Results {
		res := &r.Results[i]
		if res.Error != "" || res.N == 0 {
			continue
		}
		if res.System == SystemForkbox {
			r.finishForkbox(res, base)
			continue
		}
		b, ok := base[res.Operation]
		switch {
		case comparable[res.Operation] && ok:
			ratio := round2(res.P50MS / b)
			res.VsForkbox = &ratio
		case res.Note == "":
			res.Note = "reference (no forkbox measurement of " + res.Operation + ")"
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
		if res.System == SystemForkbox && res.Error != "" {
			failed = append(failed, res.Operation+": "+res.Error)
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

// WriteTable writes the report as an aligned text table followed by the
// versions of what was measured and how to read the ratio column.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tSYSTEM\tN\tP50 MS\tP99 MS\tMEAN MS\tVS FORKBOX\tTARGET / NOTE")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", label(res), res.System,
			count(res), num(res, res.P50MS), num(res, res.P99MS), num(res, res.MeanMS),
			ratio(res), note(res))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	fmt.Fprintf(w, "\n%d measured iterations per row after %d warm-ups; percentiles are nearest-rank.\n", r.N, r.Warmup)
	fmt.Fprintln(w, "VS FORKBOX = peer p50 / forkbox p50 for the same operation (above 1: forkbox is faster).")
	fmt.Fprintln(w, "forkbox run = create + exec + destroy through the REST API; targets are from DESIGN.md section 6.")
	fmt.Fprintln(w, "create from a warm pool counts only creates that took a ready member (pool full before each).")
	fmt.Fprintln(w, "snapshot and fork rows: the sandbox wrote the data (and synced) before the timed loop;")
	fmt.Fprintf(w, "fork = one call starting %d sessions; plain cp = a copy of as much data, for reference only.\n", forkCount)
	if r.Storage != "" {
		fmt.Fprintf(w, "forkbox storage driver: %s.\n", r.Storage)
	}
	for _, sys := range systemOrder {
		if v, ok := r.Versions[sys]; ok {
			if _, err := fmt.Fprintf(w, "  %-8s %s\n", sys, v); err != nil {
				return fmt.Errorf("write report: %w", err)
			}
		}
	}
	return nil
}

// count renders a row's N, "-" for rows without numbers.
func count(res Result) string {
	if res.N == 0 {
		return "-"
	}
	return fmt.Sprint(res.N)
}

// num renders a millisecond value with 2 decimals, "-" for rows without
// numbers.
func num(res Result, v float64) string {
	if res.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// ratio renders the VS FORKBOX column ("12.34x"), "-" when not comparable.
func ratio(res Result) string {
	if res.VsForkbox == nil {
		return "-"
	}
	return fmt.Sprintf("%.2fx", *res.VsForkbox)
}

// label renders a row's operation, with the data written before it.
func label(res Result) string {
	if res.DataMB > 0 {
		return fmt.Sprintf("%s (%d MB written)", res.Operation, res.DataMB)
	}
	return res.Operation
}

// note renders the last column: the error, or the target and whether it
// was met followed by the row's note.
func note(res Result) string {
	if res.Error != "" {
		return "error: " + oneLine(res.Error, 120)
	}
	if res.Target == nil {
		return res.Note
	}
	verdict := "met"
	if !res.Target.Met {
		verdict = "MISSED"
	}
	s := fmt.Sprintf("p50 <= %g ms: %s", res.Target.P50MS, verdict)
	if res.Note != "" {
		s += "; " + res.Note
	}
	return s
}

// oneLine collapses s to a single line of at most limit bytes, keeping its
// end (where command-line tools put the reason).
func oneLine(s string, limit int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > limit {
		s = "..." + s[len(s)-limit+3:]
	}
	return s
}
