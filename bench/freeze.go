package bench

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
)

// How long a snapshot keeps the sandbox frozen, seen from inside: a
// process in the sandbox wakes every millisecond and records the longest
// gap between two wake-ups while the snapshot is taken. A freeze stops
// it, so the gap is the freeze (plus a millisecond or two of the
// process's own scheduling). Measured right after the sandbox wrote
// UnsyncedMB MB without syncing (the page cache holds them, so the
// snapshot has them to write), and again after a sync, for reference.

const (
	// DefaultUnsyncedMB is how many MB (10^6 bytes) a sandbox writes
	// without sync before the unsynced-snapshot rows (the red-team
	// review's 300 MB).
	DefaultUnsyncedMB = 300
	// tickerStop is the file whose creation ends the ticker.
	tickerStop = "/tmp/.forkbox-bench-stop"
)

// tickerScript wakes every millisecond until tickerStop exists, then
// prints the longest gap between wake-ups in milliseconds. It prints
// "ready" once it runs.
const tickerScript = `import os, time
print("ready", flush=True)
last = time.monotonic(); worst = 0.0
while not os.path.exists("` + tickerStop + `"):
    time.sleep(0.001)
    now = time.monotonic(); worst = max(worst, now - last); last = now
print("gap %.3f" % (worst * 1000))`

// measureFreeze creates one session (untimed) and, per iteration, writes
// UnsyncedMB MB in it without sync (untimed), measures a snapshot of it
// (the call, and the longest stall the ticker saw), syncs, and measures
// a second snapshot the same way; the snapshots are deleted (untimed).
func (f *forkbox) measureFreeze(ctx context.Context) []Result {
	mb, w, n := f.opts.UnsyncedMB, f.opts.Warmup, f.opts.N
	rows := func(call, frozen, synced Result) []Result {
		call.DataMB, frozen.DataMB, synced.DataMB = mb, mb, mb
		return []Result{call, frozen, synced}
	}
	fail := func(err error) []Result {
		return rows(newResult(OpSnapshotUnsynced, SystemForkbox, nil, err),
			newResult(OpFrozenUnsynced, SystemForkbox, nil, err), newResult(OpFrozenSynced, SystemForkbox, nil, err))
	}
	f.opts.progressf("forkbox: write %d MB without sync, snapshot, sync, snapshot x %d", mb, w+n)
	// Memory enough that the page cache can hold the write without
	// reclaim forcing it out; disk for it.
	s, _, err := f.createWith(ctx, client.CreateRequest{DiskMB: int64(max(1024, 2*mb)), MemoryMB: int64(max(1024, 3*mb))})
	if err != nil {
		return fail(err)
	}
	defer f.destroy(ctx, s.ID)
	var calls, frozen, synced []time.Duration
	_, err = series(ctx, w, n, func(ctx context.Context) (time.Duration, error) {
		cmd := fmt.Sprintf("rm -f unsynced && head -c %d /dev/urandom > unsynced", int64(mb)*1_000_000)
		if err := f.run(ctx, s.ID, cmd); err != nil {
			return 0, err
		}
		call, gap, err := f.frozenSnapshot(ctx, s.ID)
		if err != nil {
			return 0, err
		}
		if err := f.run(ctx, s.ID, "sync"); err != nil {
			return 0, err
		}
		_, gapSynced, err := f.frozenSnapshot(ctx, s.ID)
		if err != nil {
			return 0, err
		}
		calls, frozen, synced = append(calls, call), append(frozen, gap), append(synced, gapSynced)
		return call, nil
	})
	if err != nil {
		return fail(err)
	}
	// series kept the measured iterations only; drop the warm-ups here.
	calls, frozen, synced = calls[w:], frozen[w:], synced[w:]
	return rows(newResult(OpSnapshotUnsynced, SystemForkbox, calls, nil),
		newResult(OpFrozenUnsynced, SystemForkbox, frozen, nil), newResult(OpFrozenSynced, SystemForkbox, synced, nil))
}

// run runs the shell command cmd in session id and fails unless it exits 0.
func (f *forkbox) run(ctx context.Context, id, cmd string) error {
	out, err := f.c.ExecCollect(ctx, id, client.ExecRequest{Cmd: cmd, TimeoutS: writeTimeoutS})
	if err == nil && out.ExitCode != 0 {
		err = fmt.Errorf("exit code %d (stderr %q)", out.ExitCode, out.Stderr)
	}
	if err != nil {
		return fmt.Errorf("%q in %s: %w", cmd, id, err)
	}
	return nil
}

// frozenSnapshot starts the ticker in session id, snapshots the session
// once it runs, stops the ticker and deletes the snapshot. It returns how
// long the snapshot call took and the longest gap the ticker saw.
func (f *forkbox) frozenSnapshot(ctx context.Context, id string) (call, gap time.Duration, err error) {
	if err := f.run(ctx, id, "rm -f "+tickerStop); err != nil {
		return 0, 0, err
	}
	out := &lineWriter{ready: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		res, err := f.c.Exec(ctx, id, client.ExecRequest{Argv: []string{"python3", "-c", tickerScript}, TimeoutS: 300}, out, nil)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("ticker exit code %d", res.ExitCode)
		}
		done <- err
	}()
	select {
	case <-out.ready:
	case err := <-done:
		return 0, 0, fmt.Errorf("ticker in %s ended before it ran: %v", id, err)
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	sn, call, serr := f.snapshot(ctx, id)
	if err := f.run(ctx, id, "touch "+tickerStop); err != nil && serr == nil {
		serr = err
	}
	if err := <-done; err != nil && serr == nil {
		serr = fmt.Errorf("ticker in %s: %w", id, err)
	}
	if sn != nil {
		if err := f.deleteSnapshot(ctx, sn.ID, false); err != nil && serr == nil {
			serr = err
		}
	}
	if serr != nil {
		return 0, 0, serr
	}
	gapMS, ok := out.gap()
	if !ok {
		return 0, 0, fmt.Errorf("ticker in %s printed no gap: %q", id, out.String())
	}
	return call, time.Duration(gapMS * float64(time.Millisecond)), nil
}

// lineWriter collects the ticker's output and closes ready at its first
// line.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan struct{}
	once  sync.Once
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if bytes.Contains(l.buf.Bytes(), []byte("ready\n")) {
		l.once.Do(func() { close(l.ready) })
	}
	return len(p), nil
}

func (l *lineWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// gap returns the milliseconds of the ticker's "gap N" line.
func (l *lineWriter) gap() (float64, bool) {
	for _, line := range strings.Split(l.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "gap "); ok {
			g, err := strconv.ParseFloat(v, 64)
			return g, err == nil
		}
	}
	return 0, false
}
