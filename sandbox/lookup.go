package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// lookup returns the live sandbox with id, or nil.
func (m *Manager) lookup(id string) *Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id]
}

// find is lookup for a caller: nil also when the sandbox is another
// tenant's or nobody's (tenancy.Owns), so that it reads as unknown.
func (m *Manager) find(ctx context.Context, id string) *Sandbox {
	sb := m.lookup(id)
	if sb == nil || !tenancy.Owns(ctx, sb.Record().Tenant) {
		return nil
	}
	return sb
}

// record returns session id's stored record for a caller: ErrNotFound
// also when it is another tenant's.
func (m *Manager) record(ctx context.Context, id string) (*node.Session, error) {
	rec, err := m.opts.Store.GetSession(ctx, id)
	if err == nil && !tenancy.Owns(ctx, rec.Tenant) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "session %q", id)
	}
	return rec, err
}

// Get returns the session's record; ErrNotFound for an unknown id (and
// for warm-pool members, which are not sessions yet).
func (m *Manager) Get(ctx context.Context, id string) (*node.Session, error) {
	if sb := m.find(ctx, id); sb != nil {
		r := sb.Record()
		if r.State == node.StatePooled {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "session %q", id)
		}
		return &r, nil
	}
	rec, err := m.record(ctx, id)
	if err == nil && rec.State == node.StatePooled {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "session %q", id)
	}
	return rec, err
}

// List returns sessions matching f, newest first, with live state.
// ErrInvalidArgument for a metadata key no session can have.
func (m *Manager) List(ctx context.Context, f node.SessionFilter) ([]*node.Session, error) {
	for k := range f.Metadata {
		if err := validMetadataKey(k); err != nil {
			return nil, err
		}
	}
	if c, ok := tenancy.From(ctx); ok {
		f.Tenant = c.Tenant // a caller lists its own tenant's sessions only
	}
	recs, err := m.opts.Store.ListSessions(ctx, f)
	if err != nil {
		return nil, err
	}
	for i, r := range recs {
		if sb := m.lookup(r.ID); sb != nil {
			live := sb.Record()
			recs[i] = &live
		}
	}
	return recs, nil
}

// use returns the live, running sandbox with id for an exec or files call,
// and a release function the caller runs when the call is over (it feeds
// the auto-pause idle clock). A session paused for idleness is resumed
// first; one paused on request is ErrConflict ("paused"). ErrNotFound for
// an unknown id; ErrTerminated (with the reason) for one that has ended;
// ErrConflict while it is being created or torn down.
func (m *Manager) use(ctx context.Context, id string) (*Sandbox, func(), error) {
	for attempt := 0; ; attempt++ {
		sb := m.find(ctx, id)
		if sb == nil {
			break
		}
		sb.mu.Lock()
		state, auto := sb.rec.State, sb.rec.AutoPaused
		if state == node.StateRunning && !sb.tearing {
			sb.inflight++
			sb.lastUse = time.Now()
			sb.mu.Unlock()
			return sb, func() { m.released(sb) }, nil
		}
		if state == node.StateTerminated {
			// Ended, not yet out of the table: its reason, as for one
			// that is (a caller told the session ended reads why).
			err := terminatedError(&sb.rec)
			sb.mu.Unlock()
			return nil, nil, err
		}
		sb.mu.Unlock()
		switch {
		case state == node.StatePaused && auto && attempt == 0:
			rec, err := m.Resume(ctx, id)
			if err != nil {
				return nil, nil, err
			}
			m.opts.Audit.Record(ctx, audit.Event{Tenant: rec.Tenant, Session: id, Kind: "session.resume",
				Detail: map[string]any{"cause": "the next call (auto-resume)"}})
			continue
		case state == node.StatePaused:
			return nil, nil, errdefs.Newf(errdefs.ErrConflict,
				"session %s is paused; resume it first (POST /v1/sessions/%s/resume)", id, id)
		case state == node.StatePooled:
			return nil, nil, errdefs.Newf(errdefs.ErrNotFound, "session %q", id)
		}
		return nil, nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, state)
	}
	rec, err := m.record(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if rec.State == node.StateTerminated {
		return nil, nil, terminatedError(rec)
	}
	if rec.State == node.StatePooled {
		return nil, nil, errdefs.Newf(errdefs.ErrNotFound, "session %q", id)
	}
	return nil, nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, rec.State)
}

// released ends one call begun by use.
func (m *Manager) released(sb *Sandbox) {
	sb.mu.Lock()
	sb.inflight--
	sb.lastUse = time.Now()
	sb.mu.Unlock()
}

func terminatedError(rec *node.Session) error {
	msg := fmt.Sprintf("session %s ended (%s)", rec.ID, rec.Reason)
	if rec.Detail != "" {
		msg += ": " + rec.Detail
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrTerminated)
}
