package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// agentCalls is what Files, Commands and Meter share: the core they call
// into and the classification of errors from a session's agent.
type agentCalls struct{ m *Manager }

// agentError classifies err from a call to session id's agent
// (guest.Classify; field names the request field bad input refers to) and
// checks the host where the class calls for it (hostCheck).
func (a agentCalls) agentError(ctx context.Context, id string, err error, field string) error {
	return a.hostCheck(ctx, id, guest.Classify(ctx, err, field))
}

// hostCheck returns what err, a classified agent error (*guest.Error),
// carries, unless the host tells more: when the agent failed
// (guest.Failed) or could not be reached (guest.Unreachable) because
// session id ended meanwhile, the error says so (ErrTerminated); an
// unreachable agent whose sandbox died (checkDead) ends the session and
// says why. Errors that are no *guest.Error are returned as they are.
func (a agentCalls) hostCheck(ctx context.Context, id string, err error) error {
	var ge *guest.Error
	if !errors.As(err, &ge) {
		return err
	}
	if ge.Kind == guest.Refused {
		return ge.Err
	}
	if ended := a.endedError(ctx, id); ended != nil {
		return ended
	}
	if ge.Kind == guest.Failed {
		return ge.Err
	}
	if ended := a.checkDead(ctx, id); ended != nil {
		return ended
	}
	var de *guest.DialError
	if errors.As(ge.Cause, &de) {
		// The answer says why without the host path; the log has it.
		a.m.log.Warn("agent unreachable", "session", id, "socket", de.Path, "err", de.Err)
	}
	return ge.Err
}

// checkDead asks the runtime whether sandbox id still runs after its agent
// could not be reached. A sandbox whose init (the agent) is gone is torn down
// with reason error and the returned error says so; nil means it runs.
func (a agentCalls) checkDead(ctx context.Context, id string) error {
	sb := a.m.lookup(id)
	if sb == nil {
		return nil
	}
	st, err := a.m.runtimes.driverOf(sb).Status(context.WithoutCancel(ctx), id)
	if err != nil || st == runtime.StatusRunning || st == runtime.StatusPaused {
		return nil
	}
	a.m.log.Warn("sandbox died", "session", id, "runtime_status", st)
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	// Why, while the host still has its cgroups (teardown removes them).
	cause := runtime.StopUnknown
	if se, ok := a.m.runtimes.driverOf(sb).(runtime.StopExplainer); ok {
		cause = se.StopCause(tctx, id)
	}
	switch cause {
	case runtime.StopPidsLimit:
		a.m.mon.EndForAbuse(sb, a.m.mon.Detector().PidsLimitStop(id), node.ReasonPidsLimit)
	case runtime.StopMemoryLimit:
		_ = a.m.teardown(tctx, sb, node.ReasonError, "the sandbox went over its memory limit, which stops the whole sandbox")
	default:
		_ = a.m.teardown(tctx, sb, node.ReasonError, "the sandbox's init process exited")
	}
	return a.endedError(ctx, id)
}

// endedError returns ErrTerminated with the reason when session id is being
// torn down or has ended (an agent call failed because of that), else nil.
func (a agentCalls) endedError(ctx context.Context, id string) error {
	var rec node.Session
	if sb := a.m.lookup(id); sb != nil {
		rec = sb.Record()
	} else if r, err := a.m.opts.Store.GetSession(context.WithoutCancel(ctx), id); err == nil {
		rec = *r
	} else {
		return nil
	}
	if rec.State == node.StateTerminating || rec.State == node.StateTerminated {
		return terminatedError(&rec)
	}
	return nil
}
