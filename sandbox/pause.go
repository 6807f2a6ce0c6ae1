package sandbox

import (
	"context"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// Pause freezes every process of session id through the cgroup freezer: a
// paused sandbox uses no CPU, and its processes, memory and open files stay
// as they are. Its timeout clock stops: the time it had left is kept and
// given back on Resume. A session cannot stay paused longer than the
// maximum session timeout (Limits.MaxTimeoutS); then it ends with reason
// timeout. Exec and files calls on a paused session fail with ErrConflict
// ("paused") — except for a session paused by its own auto-pause, which
// resumes on its next call. ErrConflict when it is not running.
func (m *Manager) Pause(ctx context.Context, id string) (*node.Session, error) {
	return m.pause(ctx, id, pauseRequested)
}

// pauseCause says why a session is paused; it decides whether the next
// call resumes it and how much time it gets then.
type pauseCause int

const (
	// pauseRequested: a client asked; resume is explicit, with the time left.
	pauseRequested pauseCause = iota
	// pauseIdle: its AutoPauseS ran out; the next call resumes it, with the time left.
	pauseIdle
	// pauseTimeout: its timeout was reached and OnTimeout is pause; it
	// resumes (on its next call if AutoResume) with a full TimeoutS.
	pauseTimeout
)

func (m *Manager) pause(ctx context.Context, id string, cause pauseCause) (*node.Session, error) {
	sb, err := m.pausable(ctx, id)
	if err != nil {
		return nil, err
	}
	sb.lifeMu.Lock()
	defer sb.lifeMu.Unlock()
	if st := sb.Record().State; st != node.StateRunning {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, st)
	}
	// Not between a command's start and its pid: execs that start after
	// this see the session paused.
	defer sb.starts.hold(startHoldMax)()
	if err := m.runtimes.driverOf(sb).Pause(ctx, id); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	rec, err := m.save(ctx, sb, func(r *node.Session) error {
		if sb.tearing || r.State != node.StateRunning {
			return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, node.StateTerminating)
		}
		if cause == pauseTimeout && !timeoutDue(r) {
			return errNotDue
		}
		r.State = node.StatePaused
		r.PausedAt = now
		r.Remaining = max(r.ExpiresAt.Sub(now), time.Second)
		if cause == pauseTimeout {
			r.Remaining = time.Duration(r.TimeoutS) * time.Second
		}
		r.ExpiresAt = now.Add(time.Duration(m.opts.Limits.MaxTimeoutS) * time.Second)
		r.AutoPaused = cause == pauseIdle || (cause == pauseTimeout && r.AutoResume)
		if sb.idle != nil {
			sb.idle.Stop()
		}
		return nil
	})
	if err != nil {
		_ = m.runtimes.driverOf(sb).Resume(context.WithoutCancel(ctx), id)
		return nil, err
	}
	m.arm(sb)
	m.log.Info("session paused", "session", id, "tenant", rec.Tenant, "cause", cause)
	if cause != pauseRequested { // (a requested pause is its request's record)
		why := map[pauseCause]string{pauseIdle: "idle (auto_pause_s)", pauseTimeout: "timeout (on_timeout pause)"}[cause]
		m.opts.Audit.Record(ctx, audit.Event{Tenant: rec.Tenant, Session: id, Kind: "session.pause",
			Detail: map[string]any{"cause": why}})
	}
	return &rec, nil
}

// Resume thaws a paused session and restarts its timeout clock with the
// time it had left. ErrConflict when it is not paused.
func (m *Manager) Resume(ctx context.Context, id string) (*node.Session, error) {
	sb, err := m.pausable(ctx, id)
	if err != nil {
		return nil, err
	}
	sb.lifeMu.Lock()
	defer sb.lifeMu.Unlock()
	if st := sb.Record().State; st != node.StatePaused {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s, not paused", id, st)
	}
	if err := m.runtimes.driverOf(sb).Resume(ctx, id); err != nil {
		return nil, err
	}
	rec, err := m.save(ctx, sb, func(r *node.Session) error {
		if sb.tearing || r.State != node.StatePaused {
			return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, node.StateTerminating)
		}
		now := time.Now().UTC()
		r.State = node.StateRunning
		r.ExpiresAt = now.Add(r.Remaining)
		r.PausedAt, r.Remaining = time.Time{}, 0
		r.AutoPaused = false
		sb.lastUse = now
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.arm(sb)
	m.armIdle(sb)
	m.log.Info("session resumed", "session", id)
	return &rec, nil
}

// pausable returns the live sandbox of session id for pause or resume, or
// the error use would give for an unknown or ended one.
func (m *Manager) pausable(ctx context.Context, id string) (*Sandbox, error) {
	sb := m.find(ctx, id)
	if sb == nil || !isLive(sb.Record().State) {
		if sb != nil && sb.Record().State != node.StatePooled {
			return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, sb.Record().State)
		}
		_, _, err := m.use(ctx, id)
		return nil, err
	}
	return sb, nil
}

// armIdle starts the auto-pause clock of a session created with
// AutoPauseS: when no exec or files call has run for that long, the
// session is paused (auto). Calls still in progress keep it awake;
// processes left running in the background do not.
func (m *Manager) armIdle(sb *Sandbox) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	period := time.Duration(sb.rec.AutoPauseS) * time.Second
	if period <= 0 || sb.rec.State != node.StateRunning || sb.tearing {
		return
	}
	if sb.idle != nil {
		sb.idle.Stop()
	}
	var check func()
	check = func() {
		sb.mu.Lock()
		idleFor := time.Since(sb.lastUse)
		busy := sb.inflight > 0
		running := sb.rec.State == node.StateRunning && !sb.tearing
		if running && (busy || idleFor < period) {
			wait := period - idleFor
			if busy || wait <= 0 {
				wait = period
			}
			sb.idle = time.AfterFunc(wait, check)
		}
		sb.mu.Unlock()
		if !running || busy || idleFor < period {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := m.pause(ctx, sb.id, pauseIdle); err != nil {
			m.log.Warn("auto-pause", "session", sb.id, "err", err)
		}
	}
	sb.idle = time.AfterFunc(period-time.Since(sb.lastUse), check)
}
