package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
)

// forkbox's side of the snapshot rows: files snapshots of a sandbox that
// wrote data, forks and creates from them, and creates from a warm pool.
// The references beside the snapshot row (podman commit, a plain copy)
// are in references.go.

const (
	// forkCount is how many sessions the fork row starts in one call.
	forkCount = 8
	// fork64Count is how many the large fork row starts (the API's most).
	fork64Count = 64
	// fork64MaxN caps the measured rounds of the large fork row.
	fork64MaxN = 3
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

// timedCall times f and prefixes its error with what.
func timedCall(what string, f func() error) (time.Duration, error) {
	d, err := timed(f)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return d, nil
}

// filesSnap is a files snapshot the fork rows start sessions from.
type filesSnap struct {
	id     string // snapshot id
	diskMB int64  // disk limit of the session it was taken of
}

// snapDisk returns the disk limit for a session that writes mb MB: enough
// for the data, not much more (with the overlay driver on a kernel without
// project quotas, every fork reserves its whole limit).
func snapDisk(mb int) int64 { return int64(max(1024, 2*mb)) }

// writeSession creates a session with room for mb MB and writes that much
// random data in it (untimed); the caller destroys it.
func (f *forkbox) writeSession(ctx context.Context, mb int) (string, error) {
	disk := snapDisk(mb)
	f.opts.progressf("forkbox: write %d MB in a session (disk %d MB)", mb, disk)
	s, _, err := f.createWith(ctx, client.CreateRequest{DiskMB: disk})
	if err != nil {
		return "", err
	}
	out, err := f.c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: writeCmd(mb), TimeoutS: writeTimeoutS})
	if err == nil && out.ExitCode != 0 {
		err = fmt.Errorf("exit code %d (stderr %q)", out.ExitCode, out.Stderr)
	}
	if err != nil {
		_, _ = f.destroy(ctx, s.ID)
		return "", fmt.Errorf("write %d MB in %s: %w", mb, s.ID, err)
	}
	return s.ID, nil
}

// filesSnapshot returns a files snapshot of a session that wrote mb MB,
// taking it (and destroying the session) on first use; close deletes it.
func (f *forkbox) filesSnapshot(ctx context.Context, mb int) (string, int64, error) {
	if fs, ok := f.files[mb]; ok {
		return fs.id, fs.diskMB, nil
	}
	id, err := f.writeSession(ctx, mb)
	if err != nil {
		return "", 0, err
	}
	sn, _, err := f.snapshot(ctx, id)
	if _, derr := f.destroy(ctx, id); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return "", 0, err
	}
	f.files[mb] = filesSnap{id: sn.ID, diskMB: snapDisk(mb)}
	return sn.ID, snapDisk(mb), nil
}

// forkUntilExec starts k sessions from files snapshot snap (one create
// when k is 1, a fork call otherwise) and returns how long it took until
// every one of them had answered an exec of `true` (the execs run at
// once); the sessions are destroyed afterwards, untimed.
func (f *forkbox) forkUntilExec(ctx context.Context, snap string, k int, diskMB int64) (time.Duration, error) {
	var ids []string
	defer func() {
		if err := f.destroyAll(ctx, ids); err != nil {
			f.opts.progressf("forkbox: %v", err)
		}
	}()
	req := client.CreateRequest{Snapshot: snap, DiskMB: diskMB}
	return timed(func() error {
		if k == 1 {
			s, _, err := f.createWith(ctx, req)
			if err != nil {
				return err
			}
			ids = append(ids, s.ID)
		} else {
			req.Snapshot, req.Metadata = "", f.labels()
			res, err := f.c.ForkSnapshot(ctx, snap, client.ForkRequest{Count: k, CreateRequest: req})
			if err != nil {
				return fmt.Errorf("fork %s: %w", snap, err)
			}
			for _, c := range res.Sessions {
				f.track(c.ID)
				ids = append(ids, c.ID)
			}
			if len(ids) != k {
				return fmt.Errorf("fork %s: %d sessions, want %d", snap, len(ids), k)
			}
		}
		errs := make([]error, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[i] = f.exec(ctx, id) }()
		}
		wg.Wait()
		return errors.Join(errs...)
	})
}

// snapshot snapshots session id and returns the snapshot and how long the
// call took; the snapshot is remembered until deleteSnapshot.
func (f *forkbox) snapshot(ctx context.Context, id string) (*client.Snapshot, time.Duration, error) {
	var sn *client.Snapshot
	d, err := timedCall("snapshot "+id, func() (err error) { sn, err = f.c.Snapshot(ctx, id, snapshotExpiryS); return err })
	if err != nil {
		return nil, 0, err
	}
	f.mu.Lock()
	f.snaps[sn.ID] = true
	f.storage, f.snapBytes = sn.Storage, sn.SizeBytes
	f.mu.Unlock()
	return sn, d, nil
}

// deleteSnapshot deletes snapshot id (with force, also what depends on it).
func (f *forkbox) deleteSnapshot(ctx context.Context, id string, force bool) error {
	if err := f.c.DeleteSnapshot(ctx, id, force); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	f.mu.Lock()
	delete(f.snaps, id)
	for mb, fs := range f.files {
		if fs.id == id {
			delete(f.files, mb)
		}
	}
	f.mu.Unlock()
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
			if err := f.waitPoolFull(ctx, poolTemplate); err != nil {
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
	if rerr := f.restorePools(ctx); rerr != nil && err == nil {
		err = rerr
	}
	r := newResult(OpPoolCreate, SystemForkbox, samples, err)
	if misses > 0 && err == nil {
		r.Note = fmt.Sprintf("%d create(s) missed the pool, not counted", misses)
	}
	return r
}

// setPool remembers p.Template's pool as it is (once) and sets it to p.
func (f *forkbox) setPool(ctx context.Context, p client.Pool) error {
	if _, set := f.poolPrev[p.Template]; !set {
		pools, err := f.c.Pools(ctx)
		if err != nil {
			return fmt.Errorf("pools: %w", err)
		}
		var prev *client.Pool
		if i := slices.IndexFunc(pools, func(q client.Pool) bool { return q.Template == p.Template }); i >= 0 && pools[i].Size > 0 {
			q := pools[i]
			prev = &q
		}
		if f.poolPrev == nil {
			f.poolPrev = map[string]*client.Pool{}
		}
		f.poolPrev[p.Template] = prev
	}
	if _, err := f.c.SetPool(ctx, p); err != nil {
		return fmt.Errorf("set pool %s to %d: %w", p.Template, p.Size, err)
	}
	return nil
}

// restorePools puts back every pool setPool changed: as it was, or size 0.
func (f *forkbox) restorePools(ctx context.Context) error {
	var errs []error
	for template, prev := range f.poolPrev {
		p := client.Pool{Template: template}
		if prev != nil {
			p = *prev
			p.Ready, p.Starting = 0, 0
		}
		if _, err := f.c.SetPool(ctx, p); err != nil {
			errs = append(errs, fmt.Errorf("restore pool %s to %d: %w", p.Template, p.Size, err))
			continue
		}
		delete(f.poolPrev, template)
	}
	return errors.Join(errs...)
}

// waitPoolFull polls Pools until template's pool has as many ready
// members as its size and none starting, for at most poolWait.
func (f *forkbox) waitPoolFull(ctx context.Context, template string) error {
	return f.waitPool(ctx, template, "not full", func(p client.Pool, found bool) bool {
		return found && p.Size > 0 && p.Ready >= p.Size && p.Starting == 0
	})
}

// waitPoolEmpty polls Pools until template's pool has no member ready or
// starting, for at most poolWait.
func (f *forkbox) waitPoolEmpty(ctx context.Context, template string) error {
	return f.waitPool(ctx, template, "still has members", func(p client.Pool, found bool) bool {
		return !found || p.Ready == 0 && p.Starting == 0
	})
}

// waitPool polls Pools every 10 ms until done says template's pool (found:
// whether it is listed) is as wanted, for at most poolWait; the error
// says what (e.g. "not full") it still was.
func (f *forkbox) waitPool(ctx context.Context, template, what string, done func(p client.Pool, found bool) bool) error {
	ctx, cancel := context.WithTimeout(ctx, poolWait)
	defer cancel()
	var last client.Pool
	for {
		pools, err := f.c.Pools(ctx)
		if err == nil {
			i := slices.IndexFunc(pools, func(q client.Pool) bool { return q.Template == template })
			if i >= 0 {
				last = pools[i]
			}
			if done(last, i >= 0) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("warm pool %s %s after %s (ready %d of %d, starting %d; last error %v)",
				template, what, poolWait, last.Ready, last.Size, last.Starting, err)
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
