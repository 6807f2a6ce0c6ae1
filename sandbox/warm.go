package sandbox

import (
	"context"

	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// warmSnapshot returns the memory snapshot a create of req's template
// restores instead of starting the template's start command and
// awaiting its ready check (storage.Template.WarmSnapshot, made by a
// gVisor build), or "" for a create that starts it as usual. A restore
// keeps the snapshot's processes with the environment, user and working
// directory they started with and the snapshot's network, so only a
// create that asks for none of those takes it: no env, user (userGiven),
// workdir, network, secrets, public traffic, volumes or code-interpreter
// warm-up; an isolation that is the snapshot's driver (or none, when the
// host's default is it); memory for what the snapshot holds; and a
// snapshot ctx's caller can use. Any other create (and a template whose
// snapshot is gone) starts the template as any other does.
func (m *Manager) warmSnapshot(ctx context.Context, req *node.CreateSpec, userGiven bool) string {
	if req.Snapshot != "" || req.BuildStep || req.Template == "" || !storage.ValidTemplateName(req.Template) {
		return ""
	}
	if len(req.Env) > 0 || userGiven || req.Workdir != "" || req.Network != nil || len(req.Secrets) > 0 ||
		req.PublicTraffic || len(req.Volumes) > 0 || req.CodeWarm {
		return ""
	}
	tpl, err := storage.LoadTemplate(m.opts.Layout.Template(req.Template))
	if err != nil || tpl.WarmSnapshot == "" {
		return ""
	}
	snap, err := m.snaps.Resolve(ctx, tpl.WarmSnapshot)
	if err != nil || snap.Template != req.Template || snap.MemoryDriver == "" {
		return ""
	}
	isolation := req.Isolation
	if isolation == "" {
		isolation = m.runtimes.DefaultDriver().Name()
	}
	if isolation != snap.MemoryDriver || req.MemoryMB < (snap.MemoryBytes+1<<20-1)>>20 {
		return ""
	}
	return snap.ID
}
