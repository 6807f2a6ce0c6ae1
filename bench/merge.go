package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
)

// GroupMerge is the diff, merge and fork-and-run rows: the diff of a
// child that changed mergeFiles files over the snapshot of a session that
// wrote SnapshotMB, the merge of those files into a sibling (the parent),
// and a fork-and-run of forkRunCount children running `true` beside as
// many separate fork + exec calls, in the same rounds. Not a default
// group: every round starts 2 + 2×forkRunCount sessions.
const GroupMerge = "merge"

// The merge group's operations.
const (
	// OpDiff is GET /v1/sessions/{child}/diff against the snapshot the
	// child started from, after it changed mergeFiles files.
	OpDiff = "merge: diff of a child that changed 10 files"
	// OpMerge is POST /v1/sessions/{parent}/merge from that child (a
	// sibling from the same snapshot): the 10 files applied.
	OpMerge = "merge: merge of those 10 files"
	// OpForkRun is POST /v1/snapshots/{id}/fork with run `true` for
	// forkRunCount children, until the answer's last event (children kept,
	// destroyed untimed).
	OpForkRun = "fork-and-run 16 children with true"
	// OpForkExecs is forkRunCount clients at once each forking one child
	// (POST /v1/snapshots/{id}/fork, count 1) and then execing `true` in
	// it: what a caller does without fork-and-run.
	OpForkExecs = "16 separate fork + exec true calls"
)

const (
	// mergeFiles is how many files the diff and merge rows' child writes.
	mergeFiles = 10
	// forkRunCount is how many children the fork-and-run rows start.
	forkRunCount = 16
	// diffTargetMS is the diff row's target at p50 (issue 21), in ms.
	diffTargetMS float64 = 20
)

// changeCmd writes mergeFiles small files in a child (untimed).
const changeCmd = "mkdir -p changes && for i in 1 2 3 4 5 6 7 8 9 10; do head -c 4096 /dev/urandom > changes/f$i; done && sync"

// measureMerge measures GroupMerge's rows from the files snapshot of a
// session that wrote SnapshotMB (the one the fork rows use).
func (e *env) measureMerge(ctx context.Context) []Result {
	f := e.fb
	mb := e.opts.SnapshotMB
	ops := []string{OpDiff, OpMerge}
	sn, disk, err := f.filesSnapshot(ctx, mb)
	if err != nil {
		return append(dataRows(failOps(ops, SystemForkbox, err), mb), failOps([]string{OpForkRun, OpForkExecs}, SystemForkbox, err)...)
	}
	e.opts.progressf("forkbox: diff + merge of %d files over a %d MB snapshot x %d", mergeFiles, mb, e.opts.Warmup+e.opts.N)
	rows := dataRows(e.compete(ctx, e.opts.Warmup, e.opts.N, ops, contender{system: SystemForkbox,
		step: func(ctx context.Context) ([]time.Duration, error) { return f.diffAndMerge(ctx, sn, disk) }}), mb)
	e.opts.progressf("forkbox: fork-and-run %d beside %d fork + exec calls x %d", forkRunCount, forkRunCount, e.opts.Warmup+e.opts.N)
	// Both in one step, so that each round pairs them on the same load;
	// the separate calls' row carries the ratio to fork-and-run.
	var runs, seps []time.Duration
	round := 0
	pair := e.compete(ctx, e.opts.Warmup, e.opts.N, []string{OpForkRun, OpForkExecs}, contender{system: SystemForkbox,
		step: func(ctx context.Context) ([]time.Duration, error) {
			round++
			run, err := f.forkRun(ctx, sn, disk)
			if err != nil {
				return nil, err
			}
			sep, err := f.forkExecs(ctx, sn, disk)
			if err == nil && round > e.opts.Warmup {
				runs, seps = append(runs, run), append(seps, sep)
			}
			return []time.Duration{run, sep}, err
		}})
	for i := range pair {
		if pair[i].Operation == OpForkExecs && pair[i].Error == "" {
			pair[i].setPaired(runs, seps)
			if pair[i].PairedRatio != nil {
				pair[i].Note = fmt.Sprintf("%.2fx fork-and-run's time in the same round (median of %d)", *pair[i].PairedRatio, pair[i].Pairs)
			}
		}
	}
	for i := range rows {
		if rows[i].Operation == OpDiff && rows[i].Error == "" && rows[i].N > 0 {
			verdict := "met"
			if rows[i].P50MS > diffTargetMS {
				verdict = "MISSED"
			}
			rows[i].Note = fmt.Sprintf("target <= %g ms: %s", diffTargetMS, verdict)
		}
	}
	return append(rows, pair...)
}

// diffAndMerge starts a parent and a child from snapshot snap (untimed),
// has the child write mergeFiles files, and times the child's diff and
// the merge of its changes into the parent; both are destroyed after.
func (f *forkbox) diffAndMerge(ctx context.Context, snap string, diskMB int64) ([]time.Duration, error) {
	var ids []string
	defer func() {
		if err := f.destroyAll(ctx, ids); err != nil {
			f.opts.progressf("forkbox: %v", err)
		}
	}()
	req := client.CreateRequest{Snapshot: snap, DiskMB: diskMB}
	for range 2 {
		s, _, err := f.createWith(ctx, req)
		if err != nil {
			return nil, err
		}
		ids = append(ids, s.ID)
	}
	parent, child := ids[0], ids[1]
	out, err := f.c.ExecCollect(ctx, child, client.ExecRequest{Cmd: changeCmd})
	if err == nil && out.ExitCode != 0 {
		err = fmt.Errorf("exit code %d (stderr %q)", out.ExitCode, out.Stderr)
	}
	if err != nil {
		return nil, fmt.Errorf("change files in %s: %w", child, err)
	}
	var diff *client.Diff
	d, err := timedCall("diff "+child, func() (err error) { diff, err = f.c.SessionDiff(ctx, child, "", false); return err })
	if err != nil {
		return nil, err
	}
	if n := len(diff.Changes); n < mergeFiles {
		return nil, fmt.Errorf("diff %s: %d changes, want at least %d", child, n, mergeFiles)
	}
	var res *client.MergeResult
	m, err := timedCall("merge "+child+" into "+parent, func() (err error) {
		res, err = f.c.Merge(ctx, parent, client.MergeRequest{From: child})
		return err
	})
	if err != nil {
		return nil, err
	}
	if n := len(res.Applied); n < mergeFiles {
		return nil, fmt.Errorf("merge into %s: %d paths applied, want at least %d", parent, n, mergeFiles)
	}
	return []time.Duration{d, m}, nil
}

// forkRun times a fork-and-run of forkRunCount children of snap running
// `true`, keeping them all (destroyed after, untimed).
func (f *forkbox) forkRun(ctx context.Context, snap string, diskMB int64) (time.Duration, error) {
	var done *client.ForkEvent
	var ids []string
	defer func() {
		if err := f.destroyAll(ctx, ids); err != nil {
			f.opts.progressf("forkbox: %v", err)
		}
	}()
	req := client.ForkRequest{Count: forkRunCount, Run: &client.ForkRun{Cmd: "true"}, Keep: "all",
		CreateRequest: client.CreateRequest{DiskMB: diskMB, Metadata: f.labels()}}
	var failed error
	d, err := timedCall("fork-and-run "+snap, func() (err error) {
		done, err = f.c.ForkRun(ctx, snap, req, func(ev client.ForkEvent) {
			if ev.SessionID != "" {
				f.track(ev.SessionID)
			}
			if ev.Error != "" || ev.ExitCode != 0 {
				failed = fmt.Errorf("child %d: exit %d %s", ev.Index, ev.ExitCode, ev.Error)
			}
		})
		return err
	})
	if done != nil {
		ids = append(ids, done.Kept...)
		for _, id := range done.Kept {
			f.track(id)
		}
	}
	if err == nil {
		err = failed
	}
	if err == nil && len(ids) != forkRunCount {
		err = fmt.Errorf("fork-and-run %s kept %d children, want %d", snap, len(ids), forkRunCount)
	}
	return d, err
}

// forkExecs times forkRunCount clients at once each forking one child of
// snap and execing `true` in it (destroyed after, untimed).
func (f *forkbox) forkExecs(ctx context.Context, snap string, diskMB int64) (time.Duration, error) {
	ids := make([]string, forkRunCount)
	defer func() {
		var live []string
		for _, id := range ids {
			if id != "" {
				live = append(live, id)
			}
		}
		if err := f.destroyAll(ctx, live); err != nil {
			f.opts.progressf("forkbox: %v", err)
		}
	}()
	req := client.ForkRequest{Count: 1, CreateRequest: client.CreateRequest{DiskMB: diskMB, Metadata: f.labels()}}
	return timed(func() error {
		errs := make([]error, forkRunCount)
		var wg sync.WaitGroup
		for i := range forkRunCount {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := f.c.ForkSnapshot(ctx, snap, req)
				if err != nil {
					errs[i] = fmt.Errorf("fork %s: %w", snap, err)
					return
				}
				if len(res.Sessions) != 1 {
					errs[i] = fmt.Errorf("fork %s: %d sessions", snap, len(res.Sessions))
					return
				}
				id := res.Sessions[0].ID
				f.track(id)
				ids[i] = id
				_, errs[i] = f.exec(ctx, id)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	})
}
