package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// maxReadyWait bounds the readiness wait however loaded the host is; a
// create as a whole is bounded at 2 minutes.
const maxReadyWait = 90 * time.Second

// minReadyRetry is the shortest Retry-After of a sandbox-not-ready answer.
const minReadyRetry = 5 * time.Second

// readyWait returns how long a create waits for the agent of a sandbox on
// driver d: the base wait (Options.AgentReadyTimeout, else
// defaults.AgentReadyTimeout), times the driver's start-up scale
// (runtime.StartScaler: gVisor boots a kernel first), times the host's
// 1-minute load average per CPU when that is above 1, at most
// maxReadyWait.
func (rt *Runtimes) readyWait(d runtime.Driver) time.Duration {
	base := rt.m.opts.AgentReadyTimeout
	if base <= 0 {
		base = defaults.AgentReadyTimeout
	}
	scale := 1.0
	if s, ok := d.(runtime.StartScaler); ok {
		scale = s.StartScale()
	}
	load, err := loadAverage()
	if err != nil {
		load = 0 // (unknown: no scaling for load)
	}
	return scaledWait(base, scale, load, goruntime.NumCPU())
}

// scaledWait is base × scale × max(1, load/cpus), at most maxReadyWait
// (and never below base). load is the 1-minute load average, cpus the
// CPUs the daemon may use.
func scaledWait(base time.Duration, scale, load float64, cpus int) time.Duration {
	f := max(scale, 1)
	if cpus > 0 && load > float64(cpus) {
		f *= load / float64(cpus)
	}
	w := time.Duration(float64(base) * f)
	return max(min(w, maxReadyWait), base)
}

// loadAverage reads the host's 1-minute load average (/proc/loadavg).
func loadAverage() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}

// awaitAgent waits, at most wait, until sb's agent answers. It fails at
// once when the sandbox stops meanwhile (its agent exited; the agent's
// log in the sandbox directory says why), and with a 503
// sandbox-not-ready (Retry-After: the wait, at least minReadyRetry) when
// the wait runs out. A Destroy of the sandbox under way cuts the wait
// short (abortReady).
func (m *Manager) awaitAgent(ctx context.Context, sb *Sandbox, wait time.Duration) error {
	readyCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	sb.mu.Lock()
	sb.abortReady = cancel
	aborted := sb.deleteRequested
	sb.mu.Unlock()
	if aborted {
		return errCreateAborted
	}
	began := time.Now()
	done := make(chan error, 1)
	go func() { done <- sb.agent.WaitReady(readyCtx) }()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				return nil
			}
			if errors.Is(readyCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
				e := errdefs.Typed(errdefs.ErrUnavailable, node.ProblemSandboxNotReady,
					"the sandbox's agent did not answer within %s (the host may be overloaded; retry later)", wait.Round(time.Second))
				e.RetryAfter = max(wait, minReadyRetry)
				return e
			}
			return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
		case <-tick.C:
			// A sandbox whose agent exited will never answer: say so now
			// rather than at the end of the wait.
			st, err := m.runtimes.driverOf(sb).Status(readyCtx, sb.id)
			if err != nil || (st != runtime.StatusStopped && st != runtime.StatusUnknown) {
				continue
			}
			cancel()
			<-done
			return fmt.Errorf("the sandbox stopped %s after it started, before its agent answered (the agent's log: %s): %w",
				time.Since(began).Round(time.Millisecond), agentLogTail(sb.dir), errdefs.ErrInternal)
		}
	}
}

// agentLogTail returns the last line of the agent's log in a sandbox's
// directory (where it says why it stopped), at most 512 bytes; "" when
// there is none.
func agentLogTail(dir string) string {
	f, err := os.Open(filepath.Join(dir, "agent.log"))
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > 4096 {
		_, _ = f.Seek(-4096, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, 4096))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	last := lines[len(lines)-1]
	if len(last) > 512 {
		last = last[len(last)-512:]
	}
	return last
}
