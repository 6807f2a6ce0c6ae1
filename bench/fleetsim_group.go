package bench

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"
)

// GroupFleetSim is the fleet at the design template's scale, simulated
// (fleetsim.go): many hosts heartbeating and placing against a real
// three-node JetStream cluster in this process, at FleetScales times
// the template's hosts, creates a second and live sessions. It takes
// minutes, needs no daemon, and is not in DefaultGroups.
const GroupFleetSim = "fleet-sim"

// Defaults of the fleet simulation: the system design template's fleet
// (54 hosts, about 7,830 concurrent sessions, 87 creates a second at
// peak).
const (
	DefaultFleetHosts = 54
	DefaultFleetRate  = 87
	DefaultFleetLive  = 7830
	// DefaultFleetStep is how long each step is measured (after
	// fleetSimWarmup).
	DefaultFleetStep = 15 * time.Second
)

// DefaultFleetScales are the steps' multiples of the template's fleet.
var DefaultFleetScales = []float64{1, 2, 4, 8}

// fleetSimWarmup is how long each step runs before it is measured (every
// host has heartbeaten, the first creates and destroys are done).
const fleetSimWarmup = 4 * time.Second

// fleetSimBreak are the limits past which a step counts as broken (and
// larger steps of its mode are not run): creates a second under 90 % of
// the rate asked, a place + write p99 over a second, a heartbeat p99
// over a heartbeat interval (a missed beat), or any failed operation.
const (
	fleetSimMinRate   = 0.9
	fleetSimMaxPlace  = time.Second
	fleetSimMaxBeatMS = 2000
)

// fleetSimOp names one row of a step.
func fleetSimOp(st simStep, what string) string {
	return fmt.Sprintf("fleet sim %d hosts, %g creates/s, %d live, %s: %s", st.hosts, st.rate, st.live, st.read, what)
}

// measureFleetSim runs the fleet simulation's steps: for each scale, each
// of simReads (a cached view, List cached a second, List per create), on
// one cluster whose buckets are
// deleted between steps. A mode that broke runs no larger step.
func (e *env) measureFleetSim(ctx context.Context) []Result {
	o := e.opts
	e.opts.progressf("fleet sim: starting a %d-node JetStream cluster", simNodes)
	c, err := startSimCluster(ctx)
	if err != nil {
		return []Result{{Operation: "fleet sim", System: SystemForkbox, Error: err.Error()}}
	}
	defer c.close()
	idle := idleCPU(ctx, 3*time.Second)
	broken := map[simRead]string{}
	var rows []Result
	for _, scale := range o.FleetScales {
		for _, read := range simReads {
			st := simStep{hosts: int(float64(o.FleetHosts)*scale + 0.5), rate: o.FleetRate * scale,
				live: int(float64(o.FleetLive)*scale + 0.5), read: read, warmup: fleetSimWarmup, length: o.FleetStep}
			if why := broken[read]; why != "" {
				rows = append(rows, skipped(fleetSimOp(st, "place + directory write"), SystemForkbox, why))
				continue
			}
			e.opts.progressf("fleet sim: %s", fleetSimOp(st, "running"))
			t, err := runStep(ctx, c, st)
			if rerr := c.reset(context.WithoutCancel(ctx)); rerr != nil && err == nil {
				err = rerr
			}
			if err != nil {
				rows = append(rows, Result{Operation: fleetSimOp(st, "place + directory write"), System: SystemForkbox, Error: err.Error()})
				broken[read] = "the smaller step failed"
				continue
			}
			stepRows, why := fleetSimRows(st, t, idle)
			rows = append(rows, stepRows...)
			if why != "" {
				broken[read] = fmt.Sprintf("broke at %d hosts, %g creates/s (%s)", st.hosts, st.rate, why)
			}
		}
	}
	return rows
}

// idleCPU is this process's CPU, in cores, over d with nothing running
// but the cluster (and whatever else the process does).
func idleCPU(ctx context.Context, d time.Duration) float64 {
	c0, t0 := selfCPU(), time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return (selfCPU() - c0) / time.Since(t0).Seconds()
}

// fleetSimRows turns a step's tally into its rows: place + write, the
// hosts read alone, the directory write alone, heartbeat, destroy, and
// one of CPU, operations and store size. why is non-empty when the step
// broke (fleetSimBreak), saying how.
func fleetSimRows(st simStep, t *simTally, idleCores float64) ([]Result, string) {
	secs := t.elapsed.Seconds()
	rate := func(n int) *float64 { v := round2(float64(n) / secs); return &v }
	place := newResult(fleetSimOp(st, "place + directory write"), SystemForkbox, t.place, nil)
	place.PerSecond = rate(t.creates)
	read := newResult(fleetSimOp(st, "read the hosts"), SystemForkbox, t.read, nil)
	write := newResult(fleetSimOp(st, "directory write"), SystemForkbox, t.write, nil)
	beat := newResult(fleetSimOp(st, "heartbeat write"), SystemForkbox, t.heartbeat, nil)
	beat.PerSecond = rate(t.heartbeats)
	destroy := newResult(fleetSimOp(st, "destroy (directory delete)"), SystemForkbox, t.destroy, nil)
	destroy.PerSecond = rate(t.destroys)

	var why []string
	if float64(t.creates)/secs < fleetSimMinRate*st.rate {
		why = append(why, fmt.Sprintf("%.1f creates/s of %g", float64(t.creates)/secs, st.rate))
	}
	if place.N > 0 && place.P99MS > ms(fleetSimMaxPlace) {
		why = append(why, fmt.Sprintf("place + write p99 %.0f ms", place.P99MS))
	}
	if (beat.N > 0 && beat.P99MS > fleetSimMaxBeatMS) || t.missedHB > 0 {
		why = append(why, fmt.Sprintf("heartbeat p99 %.0f ms, %d beats missed", beat.P99MS, t.missedHB))
	}
	if t.errs > 0 {
		why = append(why, fmt.Sprintf("%d operations failed, first: %v", t.errs, t.firstErr))
	}
	if place.N == 0 {
		place.Error = "no create completed in the measured time"
	}
	place.Note = fmt.Sprintf("latency from each create's scheduled time; %d live at the end", t.liveAtEnd)
	if len(why) > 0 {
		place.Note = "BROKE: " + strings.Join(why, "; ") + "; " + place.Note
	}

	cores := t.cpuSeconds / secs
	kvWrites := float64(t.creates+t.destroys+t.heartbeats) / secs
	res := Result{Operation: fleetSimOp(st, "CPU, KV operations, store"), System: SystemForkbox}
	split := "no CPU profile (the process was already profiling)"
	if p := t.profile; p != nil {
		split = fmt.Sprintf("samples: nats-server %.0f %%, GC %.0f %%, clients and simulated hosts %.0f %%", 100*p.Server, 100*p.GC, 100*p.Other)
	}
	lists := ""
	if st.read != readView {
		lists = fmt.Sprintf(" + %.1f List watches/s", float64(t.lists)/secs)
	}
	res.Note = fmt.Sprintf("process CPU %.2f cores (idle cluster %.2f; the machine, every process: %.2f of %d cores busy); %s; KV writes %.1f/s%s; "+
		"directory bucket %d messages for %d live (the rest delete markers), %.2f MB; hosts bucket %.1f kB; stores on disk %.1f MB (%d nodes, R3)",
		cores, idleCores, t.busySeconds/secs, runtime.NumCPU(), split, kvWrites, lists, t.dirMsgs, t.liveAtEnd, float64(t.dirBytes)/1e6, float64(t.hostsBytes)/1e3,
		float64(t.diskBytes)/1e6, simNodes)
	return []Result{place, read, write, beat, destroy, res}, strings.Join(why, "; ")
}
