package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/forkbox/forkbox/client"
)

// The snapshot milestone's forkbox measurements: pause and resume,
// snapshot and fork of a sandbox that wrote data, create from a warm pool.
// The references beside them (podman commit, a plain copy) are in
// references.go.

const (
	// forkCount is how many sessions the fork row starts in one call.
	forkCount = 8
	// poolTemplate is the template whose warm pool the pool row uses.
	poolTemplate = "base"
	// poolSize is the warm pool's size during the pool row. Before every
	// timed create the pool is full and nothing is starting, so the create
	// takes a ready member on a quiet host.
	poolSize = 4
	// poolWait bounds the wait for the pool to fill up.
	poolWait = 2 * time.Minute
	// snapshotExpiryS makes the daemon delete a snapshot the benchmark
	// could not (it deletes each one itself right away).
	snapshotExpiryS = 3600
	// writeTimeoutS bounds the command that writes the data.
	writeTimeoutS = 600
)

// writeCmd is the shell command that writes mb MB of random data to the
// file big in the working directory and flushes it to disk.
func writeCmd(mb int) string {
	return fmt.Sprintf("head -c %d /dev/urandom > big && sync", int64(mb)*1_000_000)
}

// measurePauseResume creates one session (untimed) and measures Pause then
// Resume of it, in pairs.
func (f *forkbox) measurePauseResume(ctx context.Context) []Result {
	w, n := f.opts.Warmup, f.opts.N
	f.opts.progressf("forkbox: pause + resume x %d in one session", w+n)
	id, _, err := f.create(ctx)
	if err == nil {
		var pauses, resumes []time.Duration
		pauses, resumes, err = pairSeries(ctx, w, n,
			func(ctx context.Context) (time.Duration, error) {
				return timedCall("pause "+id, func() error { _, err := f.c.Pause(ctx, id); return err })
			},
			func(ctx context.Context) (time.Duration, error) {
				return timedCall("resume "+id, func() error { _, err := f.c.Resume(ctx, id); return err })
			})
		if _, derr := f.destroy(ctx, id); derr != nil && err == nil {
			err = derr
		}
		if err == nil {
			return []Result{newResult(OpPause, SystemForkbox, pauses, nil), newResult(OpResume, SystemForkbox, resumes, nil)}
		}
	}
	return []Result{newResult(OpPause, SystemForkbox, nil, err), newResult(OpResume, SystemForkbox, nil, err)}
}

// timedCall times f and prefixes its error with what.
func timedCall(what string, f func() error) (time.Duration, error) {
	d, err := timed(f)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return d, nil
}

// measureSnapshots creates a session with room for SnapshotMB, writes that
// much random data in it (untimed), then measures Snapshot of it (each
// snapshot deleted afterwards, untimed) and ForkSnapshot of forkCount
// sessions from one snapshot of it (the sessions destroyed afterwards,
// untimed). It records the storage driver in f.storage, and the size the
// daemon reports for the snapshots in the snapshot row's note (a check
// that the data is in them).
func (f *forkbox) measureSnapshots(ctx context.Context) []Result {
	mb, w, n := f.opts.SnapshotMB, f.opts.Warmup, f.opts.N
	rows := func(snap, fork Result) []Result {
		snap.DataMB, fork.DataMB = mb, mb
		return []Result{snap, fork}
	}
	fail := func(err error) []Result {
		return rows(newResult(OpSnapshot, SystemForkbox, nil, err), newResult(OpFork, SystemForkbox, nil, err))
	}
	// Enough for the data, not much more: with the overlay driver on a
	// kernel without project quotas, every fork reserves its whole limit.
	disk := int64(max(1024, 2*mb))
	f.opts.progressf("forkbox: write %d MB in a session (disk %d MB)", mb, disk)
	s, _, err := f.createWith(ctx, client.CreateRequest{DiskMB: disk})
	if err != nil {
		return fail(err)
	}
	defer f.destroy(ctx, s.ID) // close retries a failed destroy
	out, err := f.c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: writeCmd(mb), TimeoutS: writeTimeoutS})
	if err == nil && out.ExitCode != 0 {
		err = fmt.Errorf("exit code %d (stderr %q)", out.ExitCode, out.Stderr)
	}
	if err != nil {
		return fail(fmt.Errorf("write %d MB in %s: %w", mb, s.ID, err))
	}

	f.opts.progressf("forkbox: snapshot x %d", w+n)
	snaps, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) {
		sn, d, err := f.snapshot(ctx, s.ID)
		if err != nil {
			return 0, err
		}
		return d, f.deleteSnapshot(ctx, sn.ID, false)
	})
	snapRow := newResult(OpSnapshot, SystemForkbox, snaps, err)
	if err == nil {
		snapRow.Note = fmt.Sprintf("size_bytes %.0f MB", float64(f.snapBytes)/1e6)
	}

	f.opts.progressf("forkbox: fork %d from a snapshot x %d", forkCount, w+n)
	sn, _, err := f.snapshot(ctx, s.ID)
	if err != nil {
		return rows(snapRow, newResult(OpFork, SystemForkbox, nil, err))
	}
	req := client.ForkRequest{Count: forkCount, CreateRequest: client.CreateRequest{DiskMB: disk, Metadata: f.labels()}}
	forks, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) {
		var res *client.ForkResult
		d, err := timedCall("fork "+sn.ID, func() (err error) { res, err = f.c.ForkSnapshot(ctx, sn.ID, req); return err })
		if err != nil {
			return 0, err
		}
		for _, c := range res.Sessions {
			f.live[c.ID] = true
		}
		for _, c := range res.Sessions {
			if _, err := f.destroy(ctx, c.ID); err != nil {
				return 0, err
			}
		}
		if len(res.Sessions) != forkCount {
			return 0, fmt.Errorf("fork %s: %d sessions, want %d", sn.ID, len(res.Sessions), forkCount)
		}
		return d, nil
	})
	if derr := f.deleteSnapshot(ctx, sn.ID, false); derr != nil && err == nil {
		err = derr
	}
	return rows(snapRow, newResult(OpFork, SystemForkbox, forks, err))
}

// snapshot snapshots session id and returns the snapshot and how long the
// call took; the snapshot is remembered until deleteSnapshot.
func (f *forkbox) snapshot(ctx context.Context, id string) (*client.Snapshot, time.Duration, error) {
	var sn *client.Snapshot
	d, err := timedCall("snapshot "+id, func() (err error) { sn, err = f.c.Snapshot(ctx, id, snapshotExpiryS); return err })
	if err != nil {
		return nil, 0, err
	}
	f.snaps[sn.ID] = true
	f.storage, f.snapBytes = sn.Storage, sn.SizeBytes
	return sn, d, nil
}

// deleteSnapshot deletes snapshot id (with force, also what depends on it).
func (f *forkbox) deleteSnapshot(ctx context.Context, id string, force bool) error {
	if err := f.c.DeleteSnapshot(ctx, id, force); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	delete(f.snaps, id)
	return nil
}

// measurePool sets a warm pool of poolSize for the base template with the
// daemon's default limits given explicitly, and measures creates asking for
// exactly those limits. Before each one it waits until the pool is full and
// nothing is starting; a create that still did not take a ready member
// (its session was made after the request was sent) is not counted and is
// retried, at most N times in the whole series. The pool is put back as it
// was at the end.
func (f *forkbox) measurePool(ctx context.Context) Result {
	w, n := f.opts.Warmup, f.opts.N
	info, err := f.c.Info(ctx)
	if err != nil {
		return newResult(OpPoolCreate, SystemForkbox, nil, fmt.Errorf("info: %w", err))
	}
	l := info.Limits
	pool := client.Pool{Template: poolTemplate, Size: poolSize, CPU: l.DefaultCPU, MemoryMB: l.DefaultMemoryMB,
		Pids: l.DefaultPids, DiskMB: l.DefaultDiskMB}
	req := client.CreateRequest{Template: pool.Template, CPU: pool.CPU, MemoryMB: pool.MemoryMB, Pids: pool.Pids, DiskMB: pool.DiskMB}
	f.opts.progressf("forkbox: create from a warm pool of %d x %d", poolSize, w+n)
	if err := f.setPool(ctx, pool); err != nil {
		return newResult(OpPoolCreate, SystemForkbox, nil, err)
	}
	misses := 0
	samples, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) {
		for {
			if err := f.waitPoolFull(ctx); err != nil {
				return 0, err
			}
			sent := time.Now()
			s, d, err := f.createWith(ctx, req)
			if err != nil {
				return 0, err
			}
			if _, err := f.destroy(ctx, s.ID); err != nil {
				return 0, err
			}
			if s.CreatedAt != nil && s.CreatedAt.Before(sent) {
				return d, nil
			}
			if misses++; misses > n {
				return 0, fmt.Errorf("%d creates did not take a warm-pool member", misses)
			}
		}
	})
	if rerr := f.restorePool(ctx); rerr != nil && err == nil {
		err = rerr
	}
	r := newResult(OpPoolCreate, SystemForkbox, samples, err)
	if misses > 0 && err == nil {
		r.Note = fmt.Sprintf("%d create(s) missed the pool, not counted", misses)
	}
	return r
}

// setPool remembers the template's pool as it is (once) and sets it to p.
func (f *forkbox) setPool(ctx context.Context, p client.Pool) error {
	if !f.poolSet {
		pools, err := f.c.Pools(ctx)
		if err != nil {
			return fmt.Errorf("pools: %w", err)
		}
		if i := slices.IndexFunc(pools, func(q client.Pool) bool { return q.Template == p.Template }); i >= 0 && pools[i].Size > 0 {
			prev := pools[i]
			f.poolPrev = &prev
		}
		f.poolSet = true
	}
	if _, err := f.c.SetPool(ctx, p); err != nil {
		return fmt.Errorf("set pool %s to %d: %w", p.Template, p.Size, err)
	}
	return nil
}

// restorePool puts back the pool setPool changed: as it was, or size 0.
func (f *forkbox) restorePool(ctx context.Context) error {
	if !f.poolSet {
		return nil
	}
	p := client.Pool{Template: poolTemplate}
	if f.poolPrev != nil {
		p = *f.poolPrev
		p.Ready, p.Starting = 0, 0
	}
	if _, err := f.c.SetPool(ctx, p); err != nil {
		return fmt.Errorf("restore pool %s to %d: %w", p.Template, p.Size, err)
	}
	f.poolSet = false
	return nil
}

// waitPoolFull polls Pools until the pool of poolTemplate has as many
// ready members as its size and none starting, for at most poolWait.
func (f *forkbox) waitPoolFull(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, poolWait)
	defer cancel()
	var last client.Pool
	for {
		pools, err := f.c.Pools(ctx)
		if err == nil {
			if i := slices.IndexFunc(pools, func(q client.Pool) bool { return q.Template == poolTemplate }); i >= 0 {
				last = pools[i]
				if last.Size > 0 && last.Ready >= last.Size && last.Starting == 0 {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("warm pool %s not full after %s (ready %d of %d, starting %d; last error %v)",
				poolTemplate, poolWait, last.Ready, last.Size, last.Starting, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// scratchDir is where the plain copy reference writes: the private
// daemon's data directory, else the system's temporary directory.
func (f *forkbox) scratchDir() string {
	if f.dataDir != "" {
		return f.dataDir
	}
	return os.TempDir()
}
