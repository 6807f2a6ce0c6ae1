package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes the report as aligned text: one line per operation
// and peer (forkbox's figures on the operation's first line, each peer's
// with its paired ratio on its own line), then the idle rows, then the
// versions of what was measured and how to read the columns.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	if len(r.Results) > 0 {
		fmt.Fprintln(tw, "OPERATION\tN\tFORKBOX P50 / P99 MS\tPEER\tPEER P50 / P99 MS\tPAIRED RATIO\tTARGET / NOTE")
	}
	for _, op := range r.operations() {
		var fb *Result
		var others []Result
		for i := range r.Results {
			switch res := r.Results[i]; {
			case res.Operation != op:
			case res.System == SystemForkbox:
				fb = &r.Results[i]
			default:
				others = append(others, res)
			}
		}
		fbCols, n, fbNote := "-", "-", ""
		if fb != nil {
			fbCols, n, fbNote = figures(*fb), count(*fb), note(*fb)
		}
		if len(others) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t%s\n", label(op, fb, others), n, fbCols, fbNote)
			continue
		}
		for i, p := range others {
			lab, nn, cols, fnote := label(op, fb, others), n, fbCols, fbNote
			if i > 0 {
				lab, nn, cols, fnote = "", "", "", ""
			}
			pn := note(p)
			if pn != "" && p.Error == "" {
				pn = p.System + ": " + pn
			}
			if fnote != "" && pn != "" {
				pn = "; " + pn
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s%s\n", lab, nn, cols, p.System, figures(p), paired(p), fnote, pn)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if len(r.Idle) > 0 {
		if len(r.Results) > 0 {
			fmt.Fprintln(w)
		}
		tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "IDLE\tSANDBOXES\tMEM/SANDBOX MIB (HOST / CGROUPS)\tCPU/SANDBOX % CORE\tDAEMON CPU %\tHOST CPU %\tRUNSC PROCS (CPU % / PSS MIB PER SANDBOX)\tCREATE / DESTROY S\tNOTE")
		for _, idle := range r.Idle {
			if idle.Error != "" {
				fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\t-\t-\terror: %s\n", idle.Isolation, idle.Sandboxes, oneLine(idle.Error, 160))
				continue
			}
			procs := "-"
			if idle.RuntimeProcs > 0 {
				procs = fmt.Sprintf("%d (%.3f / %.2f)", idle.RuntimeProcs, idle.RuntimeCPUPctPer, idle.RuntimePSSMiBPer)
			}
			target := ""
			if idle.Isolation == driverGVisor {
				verdict := "met"
				if idle.CPUPctPer > idleCPUTargetPct {
					verdict = "MISSED"
				}
				target = fmt.Sprintf("CPU <= %g %%: %s", idleCPUTargetPct, verdict)
			}
			fmt.Fprintf(tw, "%s\t%d\t%.2f / %.2f\t%.3f\t%.2f\t%.2f\t%s\t%.1f / %.1f\t%s\n", idle.Isolation, idle.Sandboxes,
				idle.HostMemMiBPer, idle.CgroupMemMiBPer, idle.CPUPctPer, idle.DaemonCPUPct, idle.HostCPUPct, procs,
				idle.CreateS, idle.DestroyS, target)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	fmt.Fprintf(w, "\n%d measured rounds per row after %d warm-ups; percentiles are nearest-rank. Heavy rows run fewer:"+
		" fork 64 at most %d rounds and the gVisor fork at most %d, both after %d warm-up; the gVisor memory rows at most %d.\n",
		r.N, r.Warmup, fork64MaxN, gvisorForkMaxN, min(r.Warmup, heavyWarmup), gvisorMaxN)
	fmt.Fprintln(w, "Each round runs forkbox and every peer of the row once, back to back (the first system rotating);")
	fmt.Fprintln(w, "PAIRED RATIO = median over the rounds of peer time / forkbox time in the same round (above 1: forkbox is faster).")
	fmt.Fprintln(w, "fork rows: the call and an exec of true in every child, until all answered; runc: as many `runc run --detach`")
	fmt.Fprintln(w, "at once until each answered `runc exec`. create = cold (no warm pool for it); the pool row counts only")
	fmt.Fprintln(w, "creates that took a ready member. sustained: per-cycle p50/p99, rate in the note, ratio per window.")
	if len(r.Idle) > 0 {
		fmt.Fprintln(w, "IDLE: memory per sandbox as the host's MemAvailable drop (every process on the host moves it) and as the")
		fmt.Fprintln(w, "growth of the sandboxes' memory cgroups + the daemon's RSS; CPU per sandbox = the sandboxes' cgroup CPU + the")
		fmt.Fprintln(w, "daemon's own (with helpers it reaped) over the window, % of one core; HOST CPU is the whole machine's busy")
		fmt.Fprintln(w, "time, other work included; the runsc processes (Sentry, gofer) are inside the sandboxes' cgroups.")
	}
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

// operations returns the operations of the report's rows, in row order.
func (r *Report) operations() []string {
	var ops []string
	for _, res := range r.Results {
		if len(ops) == 0 || ops[len(ops)-1] != res.Operation {
			ops = append(ops, res.Operation)
		}
	}
	return ops
}

// figures renders a row's "p50 / p99", "-" for rows without numbers.
func figures(res Result) string {
	switch {
	case res.Error != "":
		return "error"
	case res.N == 0:
		return "-"
	}
	return fmt.Sprintf("%.2f / %.2f", res.P50MS, res.P99MS)
}

// count renders a row's N, "-" for rows without numbers.
func count(res Result) string {
	if res.N == 0 {
		return "-"
	}
	return fmt.Sprint(res.N)
}

// paired renders the PAIRED RATIO column ("12.34x (n 20)"), "-" when the
// row has none.
func paired(res Result) string {
	if res.PairedRatio == nil {
		return "-"
	}
	if res.Pairs == 1 {
		return fmt.Sprintf("%.2fx (1 pair)", *res.PairedRatio)
	}
	return fmt.Sprintf("%.2fx (%d pairs)", *res.PairedRatio, res.Pairs)
}

// label renders an operation, with the data written before it.
func label(op string, fb *Result, others []Result) string {
	mb := 0
	if fb != nil {
		mb = fb.DataMB
	}
	for _, o := range others {
		mb = max(mb, o.DataMB)
	}
	switch {
	case mb > 0 && strings.HasPrefix(op, "gVisor"):
		return fmt.Sprintf("%s (%d MB resident)", op, mb)
	case mb > 0:
		return fmt.Sprintf("%s (%d MB written)", op, mb)
	}
	return op
}

// note renders a row's note column: the error, or the rate, the target
// and whether it was met, and the row's note.
func note(res Result) string {
	if res.Error != "" {
		return res.System + " error: " + oneLine(res.Error, 160)
	}
	var parts []string
	if res.PerSecond != nil {
		parts = append(parts, fmt.Sprintf("%.1f a second", *res.PerSecond))
	}
	if t := res.Target; t != nil {
		verdict := "met"
		if !t.Met {
			verdict = "MISSED"
		}
		if t.MinPerSecond > 0 {
			parts = append(parts, fmt.Sprintf(">= %g a second: %s", t.MinPerSecond, verdict))
		} else {
			parts = append(parts, fmt.Sprintf("p50 <= %g ms: %s", t.P50MS, verdict))
		}
	}
	if res.Note != "" {
		parts = append(parts, res.Note)
	}
	return strings.Join(parts, "; ")
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
