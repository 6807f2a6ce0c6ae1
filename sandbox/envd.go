package sandbox

import (
	"context"
	"crypto/subtle"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/node"
)

// CheckEnvdToken checks that token is session id's envd access token
// (constant-time) and returns the session's record. ErrNotFound for an
// unknown id; ErrTerminated for an ended session; ErrUnauthenticated for a
// wrong or missing token. It changes nothing (a paused session stays
// paused), so it is safe to call for a request that is not yet trusted.
func (cs *Commands) CheckEnvdToken(ctx context.Context, id, token string) (*node.Session, error) {
	rec, err := cs.m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State == node.StateTerminated {
		return nil, terminatedError(rec)
	}
	// A record without a token (made before tokens existed) opens to none.
	if rec.EnvdToken == "" || subtle.ConstantTimeCompare([]byte(rec.EnvdToken), []byte(token)) != 1 {
		return nil, errdefs.Newf(errdefs.ErrUnauthenticated, "wrong or missing envd access token for sandbox %s", id)
	}
	return rec, nil
}

// OpenEnvd returns a hold on running session id's agent for one envd
// request whose token CheckEnvdToken accepted. Like an exec, it resumes a
// session that its own auto-pause (or an auto-resuming pause on timeout)
// paused, and it keeps the session from idling while held. Errors as for
// Exec: ErrNotFound, ErrTerminated, or ErrConflict for a session paused on
// request or still being created.
func (cs *Commands) OpenEnvd(ctx context.Context, id string) (*node.EnvdConn, error) {
	sb, release, err := cs.m.use(ctx, id)
	if err != nil {
		return nil, err
	}
	conn := node.NewEnvdConn(sb.agent.HTTPClient(), guest.BaseURL, release)
	conn.StartCommand = guest.StartCommand
	return conn, nil
}

// AgentHealthy reports (nil) whether running session id's agent answers its
// health check, without resuming or otherwise touching the session.
// ErrConflict when the session is not running (paused, for one).
func (cs *Commands) AgentHealthy(ctx context.Context, id string) error {
	sb := cs.m.find(ctx, id)
	if sb == nil {
		rec, err := cs.m.Get(ctx, id)
		if err != nil {
			return err
		}
		if rec.State == node.StateTerminated {
			return terminatedError(rec)
		}
		return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, rec.State)
	}
	if st := sb.Record().State; st != node.StateRunning {
		return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, st)
	}
	if err := sb.agent.Health(ctx); err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "agent of session %s: %v", id, err)
	}
	return nil
}
