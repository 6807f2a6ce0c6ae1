package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
)

// Destroy tears the session down now (reason deleted). Destroying a session
// that already ended is a no-op; an unknown id is ErrNotFound. A session
// still being created is not torn down under its creator's feet: the
// create is told to stop and tear down itself, and Destroy waits for that.
func (m *Manager) Destroy(ctx context.Context, id string) error {
	sb := m.find(ctx, id)
	if sb == nil {
		rec, err := m.record(ctx, id)
		if err != nil {
			return err
		}
		if rec.State == node.StateTerminated {
			return nil
		}
		return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, rec.State)
	}
	sb.mu.Lock()
	if sb.rec.State == node.StateCreating && !sb.tearing && sb.created != nil {
		sb.deleteRequested = true
		abort := sb.abortReady
		sb.mu.Unlock()
		if abort != nil {
			abort()
		}
		select {
		case <-sb.created:
		case <-ctx.Done():
			return ctx.Err()
		}
		if sb.Record().State != node.StateTerminated {
			return fmt.Errorf("teardown of session %s is incomplete and will be retried: %w", id, errdefs.ErrUnavailable)
		}
		return nil
	}
	sb.mu.Unlock()
	return m.teardown(ctx, sb, node.ReasonDeleted, "")
}

// teardown moves sb to terminating, removes everything it has on the host
// (processes, cgroups, runtime state, mounts, writable layer, files) and
// records it as terminated with reason. If removal fails the record stays
// terminating (with the first reason) and the janitor retries. Concurrent
// calls are safe: one tears down, the others wait for it.
func (m *Manager) teardown(ctx context.Context, sb *Sandbox, reason, detail string) error {
	return m.teardownIf(ctx, sb, reason, detail, nil)
}

// errNotDue is a timeout action's refusal: the session's timeout moved
// (a SetTimeout or connect saved after the timer fired).
var errNotDue = errors.New("timeout not due")

// timeoutDue reports whether r's timeout has passed; a timer callback
// checks it in the same save that acts, so that a SetTimeout saved just
// before wins.
func timeoutDue(r *node.Session) bool { return !time.Now().Before(r.ExpiresAt) }

// teardownIf is teardown, done only if due (when not nil) holds for the
// record at the moment the session is marked terminating; otherwise it
// returns errNotDue and changes nothing.
func (m *Manager) teardownIf(ctx context.Context, sb *Sandbox, reason, detail string, due func(*node.Session) bool) error {
	// A caller that goes away (a client disconnecting) must not leave a
	// teardown half done.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var attempt chan struct{} // this call's attempt, or the one to wait for
	_, err := m.save(ctx, sb, func(r *node.Session) error {
		if sb.tearing || r.State == node.StateTerminated {
			attempt = sb.attempt
			return errTeardownRunning
		}
		if due != nil && !due(r) {
			return errNotDue
		}
		sb.tearing = true
		attempt = make(chan struct{})
		sb.attempt = attempt
		if sb.timer != nil {
			sb.timer.Stop()
		}
		for _, t := range sb.killers {
			t.Stop()
		}
		if sb.idle != nil {
			sb.idle.Stop()
		}
		if r.State != node.StateTerminating {
			// A retry keeps the reason recorded by the first attempt.
			r.State = node.StateTerminating
			r.Reason, r.Detail = reason, detail
		}
		return nil
	})
	if errors.Is(err, errTeardownRunning) {
		// Another call tears down; its outcome is ours.
		if attempt != nil {
			select {
			case <-attempt:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if sb.Record().State != node.StateTerminated {
			return fmt.Errorf("teardown of session %s is incomplete and will be retried: %w", sb.id, errdefs.ErrUnavailable)
		}
		return nil
	}
	if errors.Is(err, errNotDue) {
		return err
	}
	defer close(attempt)
	if err != nil {
		m.log.Error("record terminating", "session", sb.id, "err", err)
	}
	marked := time.Now()
	// A snapshot (or pause, or resume) that began before the sandbox was
	// marked terminating finishes first: its storage driver reads the
	// writable layer that cleanup removes (and it would fail, or thaw a
	// deleted cgroup). Later ones see the state and do not start. Taking
	// the lock is the wait; nothing needs it held afterwards.
	sb.lifeMu.Lock()
	//lint:ignore SA2001 the lock is taken only to wait for its holder
	sb.lifeMu.Unlock()
	m.mon.CountCPU(ctx, sb) // the last reading, before the cgroup goes
	counted := time.Now()
	if err := m.cleanup(ctx, sb.id, sb.Record().Driver); err != nil {
		m.log.Error("teardown incomplete; janitor will retry", "session", sb.id, "err", err)
		sb.mu.Lock()
		sb.tearing = false
		sb.mu.Unlock()
		return fmt.Errorf("teardown of session %s is incomplete and will be retried: %w (%v)", sb.id, errdefs.ErrUnavailable, err)
	}
	cleaned := time.Now()
	if sb.agent != nil {
		sb.agent.Close()
	}
	if _, err := m.save(ctx, sb, func(r *node.Session) error {
		r.State = node.StateTerminated
		r.EndedAt = time.Now().UTC()
		return nil
	}); err != nil {
		m.log.Error("record terminated", "session", sb.id, "err", err)
	}
	m.mu.Lock()
	delete(m.live, sb.id)
	m.mu.Unlock()
	sb.mu.Lock()
	res := sb.res
	sb.mu.Unlock()
	res.Release()
	close(sb.done)
	m.mon.Detector().Forget(sb.id)
	m.mon.ForgetHistory(sb.id)
	rec := sb.Record()
	if rec.Tenant != "" { // (warm-pool members belong to nobody)
		m.opts.Audit.Record(ctx, audit.Event{Tenant: rec.Tenant, Session: sb.id, Kind: "session.end",
			Detail: map[string]any{"reason": rec.Reason, "detail": rec.Detail}})
		m.opts.Metrics.Ended(rec.Reason)
	}
	m.log.Info("session ended", "session", sb.id, "tenant", rec.Tenant, "reason", rec.Reason)
	m.log.Debug("torn down", "session", sb.id, "wait_ms", ms(counted.Sub(marked)), "cleanup_ms", ms(cleaned.Sub(counted)),
		"record_ms", ms(time.Since(cleaned)))
	return nil
}

// errTeardownRunning: another call is tearing the sandbox down already.
var errTeardownRunning = errors.New("teardown in progress")

// cleanup removes every host resource of sandbox id; it is idempotent,
// and finishes what an interrupted cleanup left whatever the runtime
// still knows of the sandbox (a driver's Delete must too).
// driver names the driver it ran on; with "" (or one this host does not
// have) every driver is asked to delete it.
func (m *Manager) cleanup(ctx context.Context, id, driver string) error {
	began := time.Now()
	drivers := m.opts.Drivers
	if d := m.runtimes.driver(driver); d != nil {
		drivers = []runtime.Driver{d}
	}
	for _, d := range drivers {
		if err := d.Delete(ctx, id); err != nil {
			return err
		}
	}
	deleted := time.Now()
	if m.opts.Net != nil {
		if err := m.opts.Net.Detach(id); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	// Volumes' id-mapped views before the sandbox's directory.
	if err := m.hostRes.releaseVolumes(id); err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	// The id-mapped view of the layer goes before the layer.
	if err := m.hostRes.releaseIdentity(id); err != nil {
		return fmt.Errorf("host identity: %w", err)
	}
	released := time.Now()
	if err := m.opts.Storage.Remove(ctx, id); err != nil {
		return err
	}
	removed := time.Now()
	err := storage.RemoveTree(m.opts.Layout.Sandbox(id))
	m.log.Debug("cleaned up", "session", id, "runtime_ms", ms(deleted.Sub(began)), "release_ms", ms(released.Sub(deleted)),
		"layer_ms", ms(removed.Sub(released)), "tree_ms", ms(time.Since(removed)))
	return err
}

// Close stops timers and background work. Sandboxes keep running; the next
// daemon adopts them in Recover. Calls after the first do nothing.
func (m *Manager) Close() {
	m.Quiesce()
	m.closeOnce.Do(m.close)
}

// Quiesce is the first half of Close: background work (the monitor, the
// janitor, egress records) is told to stop and no session timer or exec
// killer fires any more, so a stopping daemon ends no session that the
// next one would adopt. What the concerns still finish (a warm-pool member
// being made) keeps working; Close then waits for the core's own work.
// Calls after the first do nothing.
func (m *Manager) Quiesce() {
	m.quiesceOnce.Do(func() {
		close(m.closing)
		m.mu.Lock()
		for _, sb := range m.live {
			sb.mu.Lock()
			if sb.timer != nil {
				sb.timer.Stop()
			}
			for _, t := range sb.killers {
				t.Stop()
			}
			sb.mu.Unlock()
		}
		m.mu.Unlock()
	})
}

func (m *Manager) close() {
	m.mu.Lock()
	for _, sb := range m.live {
		if sb.agent != nil {
			sb.agent.Close()
		}
	}
	m.mu.Unlock()
	m.wg.Wait()
}
