package sandbox

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// agentFailed returns the ErrInternal TypedError of node.ProblemAgentFailed
// with the agent's message (which names paths inside the sandbox only).
func agentFailed(msg string) error {
	return errdefs.Typed(errdefs.ErrInternal, node.ProblemAgentFailed, "the sandbox's agent failed: %s", msg)
}

// setUser names the user of an agent call the way envd expects it.
func setUser(h interface{ Set(string, string) }, user string) {
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
}

// agentError maps an agent (Connect) error to an errdefs class. field names
// the request field an invalid_argument or not_found refers to, if any. When
// the sandbox ended meanwhile, the error says so (ErrTerminated). The
// agent's own internal failures are node.ProblemAgentFailed (HTTP 502); failing
// to reach it, or a deadline, is ErrUnavailable (HTTP 503, retryable).
func (m *Manager) agentError(ctx context.Context, id string, err error, field string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, errOutput) || errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return err
	}
	var ce *connect.Error
	if !errors.As(err, &ce) || !connect.IsWireError(ce) && ce.Code() != connect.CodeCanceled && ce.Code() != connect.CodeDeadlineExceeded &&
		ce.Code() != connect.CodeResourceExhausted { // (an answer larger than maxAgentMessage)
		// Not the agent's answer but a failure to talk to it (a broken
		// stream is "invalid_argument: protocol error: incomplete
		// envelope"): the sandbox may have ended or died under the call.
		if ended := m.endedError(ctx, id); ended != nil {
			return ended
		}
		if ended := m.checkDead(ctx, id); ended != nil {
			return ended
		}
		var de *dialError
		if errors.As(err, &de) {
			// The answer says why without the host path; the log has it.
			m.log.Warn("agent unreachable", "session", id, "socket", de.Path, "err", de.Err)
		}
		msg := err.Error()
		if ce != nil {
			msg = ce.Message() // (without the code Connect puts first)
		}
		return fmt.Errorf("agent: %s: %w", msg, errdefs.ErrUnavailable)
	}
	msg := ce.Message()
	switch ce.Code() {
	case connect.CodeInvalidArgument:
		if field != "" {
			return errdefs.InvalidField(field, "%s", msg)
		}
		return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalidArgument)
	case connect.CodeNotFound:
		if field != "" {
			return errdefs.InvalidField(field, "%s", msg)
		}
		return fmt.Errorf("%s: %w", msg, errdefs.ErrNotFound)
	case connect.CodeUnauthenticated:
		return errdefs.InvalidField("user", "%s", msg)
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrConflict)
	case connect.CodePermissionDenied:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrPermissionDenied)
	case connect.CodeResourceExhausted:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrResourceExhausted)
	case connect.CodeInternal, connect.CodeUnknown, connect.CodeDataLoss, connect.CodeUnimplemented:
		// The agent answered: it failed, and will fail the same way again.
		if ended := m.endedError(ctx, id); ended != nil {
			return ended
		}
		return agentFailed(msg)
	case connect.CodeCanceled, connect.CodeDeadlineExceeded:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fallthrough
	default:
		if ended := m.endedError(ctx, id); ended != nil {
			return ended
		}
		if ended := m.checkDead(ctx, id); ended != nil {
			return ended
		}
		return fmt.Errorf("agent: %s: %w", msg, errdefs.ErrUnavailable)
	}
}

// checkDead asks the runtime whether sandbox id still runs after its agent
// could not be reached. A sandbox whose init (the agent) is gone is torn down
// with reason error and the returned error says so; nil means it runs.
func (m *Manager) checkDead(ctx context.Context, id string) error {
	sb := m.lookup(id)
	if sb == nil {
		return nil
	}
	st, err := m.driverOf(sb).Status(context.WithoutCancel(ctx), id)
	if err != nil || st == runtime.StatusRunning || st == runtime.StatusPaused {
		return nil
	}
	m.log.Warn("sandbox died", "session", id, "runtime_status", st)
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	// Why, while the host still has its cgroups (teardown removes them).
	cause := runtime.StopUnknown
	if se, ok := m.driverOf(sb).(runtime.StopExplainer); ok {
		cause = se.StopCause(tctx, id)
	}
	switch cause {
	case runtime.StopPidsLimit:
		m.mon.EndForAbuse(sb, m.mon.Detector().PidsLimitStop(id), node.ReasonPidsLimit)
	case runtime.StopMemoryLimit:
		_ = m.teardown(tctx, sb, node.ReasonError, "the sandbox went over its memory limit, which stops the whole sandbox")
	default:
		_ = m.teardown(tctx, sb, node.ReasonError, "the sandbox's init process exited")
	}
	return m.endedError(ctx, id)
}

// endedError returns ErrTerminated with the reason when session id is being
// torn down or has ended (an agent call failed because of that), else nil.
func (m *Manager) endedError(ctx context.Context, id string) error {
	var rec node.Session
	if sb := m.lookup(id); sb != nil {
		rec = sb.Record()
	} else if r, err := m.opts.Store.GetSession(context.WithoutCancel(ctx), id); err == nil {
		rec = *r
	} else {
		return nil
	}
	if rec.State == node.StateTerminating || rec.State == node.StateTerminated {
		return terminatedError(&rec)
	}
	return nil
}
