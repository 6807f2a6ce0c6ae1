package e2b

import (
	"context"
	"errors"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// runningOrResume resumes rec's sandbox when it is paused and its
// lifecycle auto-resumes (E2B's lifecycle {onTimeout: 'pause',
// autoResume: true}): the next authorised request for it (envd, the
// code-execution service, a sandbox port) resumes it, whether it was
// paused by its timeout or by an explicit pause(), as E2B's proxy does.
// The open envd /health is not such a request: an unauthenticated caller
// does not wake a sandbox. Any other state is left for the Node's call
// that follows to answer. rec is the session as just read (its state and
// flag); a sandbox resumed meanwhile is not an error.
func (h *Handler) runningOrResume(ctx context.Context, rec *node.Session) error {
	if rec.State != node.StatePaused || !rec.AutoResume {
		return nil
	}
	if _, err := h.mgr.Resume(ctx, rec.ID); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return nil // resumed (or ended) meanwhile: the next call says which
		}
		return err
	}
	h.audit.Record(ctx, audit.Event{Tenant: rec.Tenant, Session: rec.ID, Kind: "session.resume",
		Detail: map[string]any{"cause": "the next request (autoResume)"}})
	return nil
}
