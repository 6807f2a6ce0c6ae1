package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// readyInterval is the pause between two tries of a template's ready
// check: short, since a create waits on it, and each try is one exec
// through the agent (a few ms).
const readyInterval = 50 * time.Millisecond

// readyTail is how much of the last try's output a failed ready check's
// error keeps, in bytes.
const readyTail = 1024

// waitReady runs tpl's ready check (storage.Template.ReadyCmd) in the new
// session rec, as its default user, until it exits 0, again readyInterval
// after each try that did not, for at most the template's ReadyTimeoutS
// (0: storage.DefaultReadyTimeoutS). This is what E2B's template builder
// does with a readyCmd after starting the start command. A check that
// does not pass in time (or a session that ends meanwhile, or a caller
// that goes away) fails the create: the session is torn down and the
// error is the 422 ready-check-failed naming the field "template", the
// command, the tries, and the exit code and output of the last try that
// ended (a try the wait's end cut short is reported only when no other
// ended). Nothing to check: nil at once.
func (m *Manager) waitReady(ctx context.Context, rec *node.Session, tpl *storage.Template) error {
	if len(tpl.ReadyCmd) == 0 {
		return nil
	}
	wait := time.Duration(tpl.ReadyTimeoutS) * time.Second
	if wait <= 0 {
		wait = storage.DefaultReadyTimeoutS * time.Second
	}
	deadline := time.Now().Add(wait)
	var last string
	tries := 0
	for {
		remaining := time.Until(deadline)
		out := &tailOutput{max: readyTail}
		tctx, cancel := context.WithTimeout(ctx, remaining)
		res, err := m.cmds.Exec(tctx, rec.ID, node.ExecSpec{Argv: tpl.ReadyCmd,
			TimeoutS: int64((remaining + time.Second - 1) / time.Second)}, out)
		cut := tctx.Err() != nil && ctx.Err() == nil // (the wait ended during this try)
		cancel()
		tries++
		switch {
		case err == nil && res.ExitCode == 0:
			return nil
		case cut || (err == nil && res.TimedOut):
			// A try the wait's end cut says nothing new: the last one
			// that ended is the better report.
			if last == "" {
				last = fmt.Sprintf("still running when the wait ended; output so far: %q", out.String())
			}
		case err == nil:
			last = fmt.Sprintf("exit code %d; output: %q", res.ExitCode, out.String())
		default:
			last = err.Error()
		}
		gone := errors.Is(err, errdefs.ErrTerminated) || errors.Is(err, errdefs.ErrNotFound)
		if ctx.Err() != nil || gone || time.Now().Add(readyInterval).After(deadline) {
			why := fmt.Sprintf("did not pass within %s", wait)
			switch {
			case ctx.Err() != nil:
				why = fmt.Sprintf("was not awaited to the end (%v)", ctx.Err())
			case gone:
				why = "could not run: the session ended"
			}
			if sb := m.lookup(rec.ID); sb != nil {
				_ = m.teardown(context.WithoutCancel(ctx), sb, node.ReasonError, readyFailedDetail)
			}
			te := errdefs.Typed(errdefs.ErrInvalidArgument, node.ProblemReadyCheckFailed,
				"the ready check of template %q (%s) %s (%d tries; the last: %s); the session was destroyed",
				rec.Template, strings.Join(tpl.ReadyCmd, " "), why, tries, last)
			te.Field = "template"
			return te
		}
		select {
		case <-ctx.Done():
		case <-time.After(readyInterval):
		}
	}
}

// tailOutput is a node.Output that keeps the last max bytes of a
// command's stdout and stderr, interleaved as they came.
type tailOutput struct {
	mu  sync.Mutex
	max int
	buf []byte
}

// Started implements node.Output.
func (o *tailOutput) Started(int) error { return nil }

// Stdout implements node.Output.
func (o *tailOutput) Stdout(p []byte) error { o.add(p); return nil }

// Stderr implements node.Output.
func (o *tailOutput) Stderr(p []byte) error { o.add(p); return nil }

// add appends p, dropping what is older than the last max bytes.
func (o *tailOutput) add(p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf, p...)
	if len(o.buf) > o.max {
		o.buf = append([]byte(nil), o.buf[len(o.buf)-o.max:]...)
	}
}

// String returns the kept output, trimmed of surrounding white space.
func (o *tailOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.TrimSpace(string(o.buf))
}
