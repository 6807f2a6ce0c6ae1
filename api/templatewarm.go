package api

import (
	"context"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// warmDeleteBlocked says why template name's delete would be refused
// once its warm snapshot warm is gone, checked before that snapshot is
// deleted so a refused delete keeps it (nil when nothing but the warm
// snapshot and the sessions restored from it hold the template, which
// the snapshot's own delete reports): a shared template and a caller
// without an admin key (ErrPermissionDenied, as template.Catalog.Delete
// says it), a live session of the template not restored from warm, or
// another snapshot built on the template (ErrConflict, as the
// daemon's template guard says them).
func (h *templateAPI) warmDeleteBlocked(ctx context.Context, name, warm string) error {
	if rec, err := h.store.GetTemplate(ctx, name); err == nil && rec.Tenant == "" {
		if caller, ok := tenancy.From(ctx); ok && !caller.Admin {
			return errdefs.Newf(errdefs.ErrPermissionDenied, "template %q is shared: only an admin key can delete it", name)
		}
	}
	live, err := h.store.ListSessions(ctx, node.SessionFilter{Template: name,
		States: []node.State{node.StateCreating, node.StateRunning, node.StatePaused, node.StateTerminating}})
	if err != nil {
		return err
	}
	for _, s := range live {
		if s.Snapshot != warm {
			return errdefs.Newf(errdefs.ErrConflict, "template %q is used by running sessions", name)
		}
	}
	snaps, err := h.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.Template == name && sn.ID != warm {
			return errdefs.Newf(errdefs.ErrConflict, "template %q is the base of snapshot %s; delete the snapshot first", name, sn.ID)
		}
	}
	return nil
}
