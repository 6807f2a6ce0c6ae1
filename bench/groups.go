package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Row groups: what Options.Only selects. Each group measures one or more
// operations, forkbox first and its peers interleaved with it.
const (
	// GroupCreate is a cold create (no warm pool) and destroy, in pairs.
	GroupCreate = "create"
	// GroupPool is a create that takes a ready warm-pool member.
	GroupPool = "pool"
	// GroupRun is create + exec + destroy, beside `runc run` and `podman
	// run --rm` of /bin/true.
	GroupRun = "run"
	// GroupExec is exec of `true` beside `runc exec` and `podman exec`.
	GroupExec = "exec"
	// GroupPause is pause and resume beside runc's and podman's.
	GroupPause = "pause"
	// GroupSnapshot is a files snapshot of a sandbox that wrote
	// SnapshotMB, beside `podman commit` and a plain copy.
	GroupSnapshot = "snapshot"
	// GroupFork is a fork of 8 from a files snapshot until every child
	// answered an exec, beside 8 runc containers started at once.
	GroupFork = "fork"
	// GroupFork64 is the same with 64 children.
	GroupFork64 = "fork64"
	// GroupRestore is one session created from a files snapshot until it
	// answered an exec, beside one runc container.
	GroupRestore = "restore"
	// GroupFreeze is the snapshot right after an unsynced write and how
	// long it froze the sandbox (freeze.go).
	GroupFreeze = "freeze"
	// GroupSustained is create → exec → destroy by several clients at
	// once for a fixed time, beside `runc run` the same way (sustained.go).
	GroupSustained = "sustained"
	// GroupGVisor is the gVisor tier's rows beside the runsc CLI
	// (gvisor.go).
	GroupGVisor = "gvisor"
	// GroupIdle is the host memory and CPU that idle sandboxes take
	// (idle.go).
	GroupIdle = "idle"
)

// Groups lists every row group, in the order they run.
var Groups = []string{GroupCreate, GroupPool, GroupRun, GroupExec, GroupPause, GroupSnapshot,
	GroupFork, GroupFork64, GroupRestore, GroupFreeze, GroupMerge, GroupSustained, GroupCode, GroupPorts, GroupEgress, GroupBroker, GroupPull, GroupBuild, GroupReady, GroupGVisor, GroupReplicate, GroupIdle, GroupRoute, GroupFleetSim}

// standalone are the groups that need neither the run's daemon nor
// peers (the route group starts daemons of its own).
var standalone = []string{GroupRoute, GroupFleetSim}

// DefaultGroups are the groups run when Options.Only is empty: the
// rows of the fork, restore and create targets, exec, pause and the
// idle figures; "all" adds the two that write hundreds of MB per
// iteration (snapshot with podman commit, freeze) and merge (34 sessions
// a round).
var DefaultGroups = []string{GroupCreate, GroupPool, GroupRun, GroupExec, GroupPause,
	GroupFork, GroupFork64, GroupRestore, GroupSustained, GroupCode, GroupPorts, GroupEgress, GroupBroker, GroupPull, GroupBuild, GroupReady, GroupGVisor, GroupIdle}

// ParseGroups turns a comma-separated list of group names ("" or
// "default": DefaultGroups; "all": Groups) into the list Run takes.
// An unknown name is an error naming the valid ones.
func ParseGroups(s string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "" || name == "default":
			out = append(out, DefaultGroups...)
		case name == "all":
			out = append(out, Groups...)
		case slices.Contains(Groups, name):
			out = append(out, name)
		default:
			return nil, fmt.Errorf("unknown row group %q (want a comma-separated list of: default, all, %s)",
				name, strings.Join(Groups, ", "))
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	slices.SortFunc(out, func(a, b string) int { return slices.Index(Groups, a) - slices.Index(Groups, b) })
	return out, nil
}

// env is what every group measures with: forkbox, and the peers (nil
// with SkipPeers).
type env struct {
	opts Options
	fb   *forkbox
	p    *peers
	idle []IdleResult // the idle rows measured so far
}

// group runs one row group and returns its rows.
func (e *env) group(ctx context.Context, name string) []Result {
	switch name {
	case GroupCreate:
		return e.measureCreate(ctx)
	case GroupPool:
		return []Result{e.fb.measurePool(ctx)}
	case GroupRun:
		return e.measureRun(ctx)
	case GroupExec:
		return e.measureExec(ctx)
	case GroupPause:
		return e.measurePause(ctx)
	case GroupSnapshot:
		return e.measureSnapshot(ctx)
	case GroupFork:
		return e.measureFork(ctx, OpFork, forkCount, e.opts.Warmup, e.opts.N)
	case GroupFork64:
		return e.measureFork(ctx, OpFork64, fork64Count, min(e.opts.Warmup, heavyWarmup), min(e.opts.N, fork64MaxN))
	case GroupRestore:
		return e.measureFork(ctx, OpRestoreFiles, 1, e.opts.Warmup, e.opts.N)
	case GroupFreeze:
		return e.fb.measureFreeze(ctx)
	case GroupMerge:
		return e.measureMerge(ctx)
	case GroupSustained:
		return e.measureSustained(ctx)
	case GroupGVisor:
		return e.measureGVisor(ctx)
	case GroupCode:
		return e.measureCode(ctx)
	case GroupPorts:
		return e.measurePorts(ctx)
	case GroupEgress:
		return e.measureEgress(ctx)
	case GroupBroker:
		return e.measureBroker(ctx)
	case GroupPull:
		return e.measurePull(ctx)
	case GroupBuild:
		return e.measureBuild(ctx)
	case GroupReady:
		return e.measureReady(ctx)
	case GroupReplicate:
		return e.measureReplicate(ctx)
	case GroupIdle:
		return e.measureIdle(ctx)
	case GroupRoute:
		return e.measureRoute(ctx)
	case GroupFleetSim:
		return e.measureFleetSim(ctx)
	}
	return nil
}

// heavyWarmup caps the warm-up rounds of the rows whose round takes many
// seconds (fork 64, the gVisor fork).
const heavyWarmup = 1

// one adapts a step timing a single operation to contender.step.
func one(f func(ctx context.Context) (time.Duration, error)) func(ctx context.Context) ([]time.Duration, error) {
	return func(ctx context.Context) ([]time.Duration, error) {
		d, err := f(ctx)
		if err != nil {
			return nil, err
		}
		return []time.Duration{d}, nil
	}
}

// compete interleaves forkbox (fb) with those of peers that can be
// measured, n rounds after warmup uncounted ones, and returns the rows; a peer
// that cannot be measured gets a skipped row per operation saying why
// (none at all with SkipPeers).
func (e *env) compete(ctx context.Context, warmup, n int, ops []string, fb contender, peers ...contender) []Result {
	cs := []contender{fb}
	var skippedRows []Result
	for _, c := range peers {
		if e.p == nil {
			continue
		}
		if why := e.p.missing(c.system); why != "" {
			for _, op := range ops {
				skippedRows = append(skippedRows, skipped(op, c.system, why))
			}
			continue
		}
		cs = append(cs, c)
	}
	return append(interleave(ctx, warmup, n, ops, cs), skippedRows...)
}

// measureCreate measures forkbox's cold create and destroy, in pairs.
// There is no peer (the run row holds the runc and podman starts).
func (e *env) measureCreate(ctx context.Context) []Result {
	f := e.fb
	e.opts.progressf("forkbox: create + destroy x %d", e.opts.Warmup+e.opts.N)
	return e.compete(ctx, e.opts.Warmup, e.opts.N, []string{OpCreate, OpDestroy}, contender{system: SystemForkbox,
		step: func(ctx context.Context) ([]time.Duration, error) {
			id, c, err := f.create(ctx)
			if err != nil {
				return nil, err
			}
			d, err := f.destroy(ctx, id)
			return []time.Duration{c, d}, err
		}})
}

// measureRun measures a whole run of `true`: forkbox create + exec +
// destroy, `runc run`, `podman run --rm`, interleaved.
func (e *env) measureRun(ctx context.Context) []Result {
	f := e.fb
	e.opts.progressf("run true to completion x %d, interleaved with runc run and podman run --rm", e.opts.Warmup+e.opts.N)
	return e.compete(ctx, e.opts.Warmup, e.opts.N, []string{OpRun},
		contender{system: SystemForkbox, step: one(func(ctx context.Context) (time.Duration, error) {
			return timed(func() error { return f.runTrue(ctx) })
		})},
		contender{system: SystemRunc, step: one(func(ctx context.Context) (time.Duration, error) { return e.p.runcRun(ctx, 0) })},
		contender{system: SystemPodman, step: one(e.p.podmanRun)})
}

// measureExec measures exec of `true` in one running sandbox (created
// untimed) beside `runc exec` and `podman exec` in one running container.
func (e *env) measureExec(ctx context.Context) []Result {
	f := e.fb
	ops := []string{OpExec}
	id, _, err := f.create(ctx)
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer f.destroy(ctx, id) // close retries a failed destroy
	e.opts.progressf("exec true x %d, interleaved with runc exec and podman exec", e.opts.Warmup+e.opts.N)
	return e.compete(ctx, e.opts.Warmup, e.opts.N, ops,
		contender{system: SystemForkbox, step: one(func(ctx context.Context) (time.Duration, error) { return f.exec(ctx, id) })},
		contender{system: SystemRunc, step: one(func(ctx context.Context) (time.Duration, error) {
			c, err := e.p.runcSleeping(ctx)
			if err != nil {
				return 0, err
			}
			return e.p.runc.run(ctx, "exec", c, "/bin/true")
		})},
		contender{system: SystemPodman, step: one(func(ctx context.Context) (time.Duration, error) {
			c, err := e.p.podmanSleeping(ctx)
			if err != nil {
				return 0, err
			}
			return e.p.podman.run(ctx, "exec", c, "/bin/true")
		})})
}

// measurePause measures pause then resume of one running sandbox beside
// `runc pause`/`resume` and `podman pause`/`unpause` of one running
// container.
func (e *env) measurePause(ctx context.Context) []Result {
	f := e.fb
	ops := []string{OpPause, OpResume}
	id, _, err := f.create(ctx)
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer f.destroy(ctx, id)
	pair := func(pause, resume func(ctx context.Context) (time.Duration, error)) func(ctx context.Context) ([]time.Duration, error) {
		return func(ctx context.Context) ([]time.Duration, error) {
			p, err := pause(ctx)
			if err != nil {
				return nil, err
			}
			r, err := resume(ctx)
			return []time.Duration{p, r}, err
		}
	}
	cli := func(t func() *tool, container func(context.Context) (string, error), pause, resume string) func(ctx context.Context) ([]time.Duration, error) {
		verb := func(v string) func(ctx context.Context) (time.Duration, error) {
			return func(ctx context.Context) (time.Duration, error) {
				c, err := container(ctx)
				if err != nil {
					return 0, err
				}
				return t().run(ctx, v, c)
			}
		}
		return pair(verb(pause), verb(resume))
	}
	e.opts.progressf("pause + resume x %d, interleaved with runc and podman", e.opts.Warmup+e.opts.N)
	var runc, podman contender
	if e.p != nil {
		runc = contender{system: SystemRunc, step: cli(func() *tool { return e.p.runc }, e.p.runcSleeping, "pause", "resume")}
		podman = contender{system: SystemPodman, step: cli(func() *tool { return e.p.podman }, e.p.podmanSleeping, "pause", "unpause")}
	}
	return e.compete(ctx, e.opts.Warmup, e.opts.N, ops, contender{system: SystemForkbox, step: pair(
		func(ctx context.Context) (time.Duration, error) {
			return timedCall("pause "+id, func() error { _, err := f.c.Pause(ctx, id); return err })
		},
		func(ctx context.Context) (time.Duration, error) {
			return timedCall("resume "+id, func() error { _, err := f.c.Resume(ctx, id); return err })
		})}, runc, podman)
}

// measureFork measures a fork of k sessions from a files snapshot of a
// session that wrote SnapshotMB (k = 1: a create from that snapshot), each
// timed until every child answered an exec of `true`, beside the runc CLI
// starting k containers at once until each answered `runc exec`.
func (e *env) measureFork(ctx context.Context, op string, k, warmup, n int) []Result {
	ops := []string{op}
	mb := e.opts.SnapshotMB
	sn, disk, err := e.fb.filesSnapshot(ctx, mb)
	if err != nil {
		return dataRows(failOps(ops, SystemForkbox, err), mb)
	}
	e.opts.progressf("%s x %d, interleaved with %d runc containers", op, warmup+n, k)
	rows := e.compete(ctx, warmup, n, ops,
		contender{system: SystemForkbox, step: one(func(ctx context.Context) (time.Duration, error) {
			return e.fb.forkUntilExec(ctx, sn, k, disk)
		})},
		contender{system: SystemRunc, step: one(func(ctx context.Context) (time.Duration, error) {
			return e.p.runcStartN(ctx, k)
		})})
	return dataRows(rows, mb)
}

// dataRows sets DataMB on every row.
func dataRows(rows []Result, mb int) []Result {
	for i := range rows {
		rows[i].DataMB = mb
	}
	return rows
}
