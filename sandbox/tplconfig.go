package sandbox

import (
	"context"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// StartTag tags the background process a template's start command runs
// as (storage.Template.StartCmd), so it can be found without its pid.
const StartTag = "start"

// templateUser returns the default user of template name: its image's
// USER (checked when it was imported), or "" when it has none, or name is
// no template name or no template (the create reports that later).
func (m *Manager) templateUser(name string) string {
	if name == "" || !storage.ValidTemplateName(name) {
		return ""
	}
	tpl, err := storage.LoadTemplate(m.opts.Layout.Template(name))
	if err != nil {
		return ""
	}
	return tpl.User
}

// runStartCommand starts the start command of rec's template, if it has
// one, in the background in the new session rec (made from the template,
// not a snapshot: a snapshot's session has the processes or the files its
// source had, and starts nothing), as the session's user in its working
// directory with its environment, tagged StartTag; then, when the
// template has a ready check, it waits for it (waitReady). A command
// that cannot start (not in the image, say) fails the create: the
// session is torn down and the error is ErrInvalidArgument naming the
// field "template".
func (m *Manager) runStartCommand(ctx context.Context, rec *node.Session) error {
	if rec.Snapshot != "" {
		return nil
	}
	tpl, err := storage.LoadTemplate(m.opts.Layout.Template(rec.Template))
	if err != nil || (len(tpl.StartCmd) == 0 && len(tpl.ReadyCmd) == 0) {
		return nil
	}
	if len(tpl.StartCmd) > 0 {
		_, err = m.cmds.Exec(ctx, rec.ID, node.ExecSpec{Argv: tpl.StartCmd, Background: true, Tag: StartTag}, discardOutput{})
	}
	if err == nil {
		return m.waitReady(ctx, rec, tpl)
	}
	if sb := m.lookup(rec.ID); sb != nil {
		_ = m.teardown(context.WithoutCancel(ctx), sb, node.ReasonError, startFailedDetail)
	}
	return errdefs.InvalidField("template", "the start command of template %q (%s) did not start: %v",
		rec.Template, strings.Join(tpl.StartCmd, " "), err)
}

// startFailedDetail and readyFailedDetail are the Detail of a session
// torn down because its template's start command did not start or its
// ready check did not pass (notStarted reads them).
const (
	startFailedDetail = "the template's start command did not start"
	readyFailedDetail = "the template's ready check did not pass"
)

// notStarted is the error a replayed create (same Idempotency-Key) of
// session rec gets when rec was torn down because its template's start
// command or ready check failed: that create failed, and so does its
// replay (ErrInvalidArgument naming "template", problem
// ready-check-failed for the check). nil for any other session.
func notStarted(rec *node.Session) error {
	if rec.State != node.StateTerminated || rec.Reason != node.ReasonError {
		return nil
	}
	switch rec.Detail {
	case readyFailedDetail:
		te := errdefs.Typed(errdefs.ErrInvalidArgument, node.ProblemReadyCheckFailed,
			"the create this Idempotency-Key made failed: session %s of template %q did not pass its ready check and was destroyed", rec.ID, rec.Template)
		te.Field = "template"
		return te
	case startFailedDetail:
		return errdefs.InvalidField("template", "the create this Idempotency-Key made failed: the start command of session %s's template %q did not start",
			rec.ID, rec.Template)
	}
	return nil
}

// discardOutput is the Output of a background command nobody reads.
type discardOutput struct{}

// Started implements node.Output.
func (discardOutput) Started(int) error { return nil }

// Stdout implements node.Output.
func (discardOutput) Stdout([]byte) error { return nil }

// Stderr implements node.Output.
func (discardOutput) Stderr([]byte) error { return nil }
