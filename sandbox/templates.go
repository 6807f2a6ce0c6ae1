package sandbox

import (
	"context"
	"errors"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/tenancy"
)

// Templates owns the core's view of templates: whether one exists and a
// caller may use it, whether sessions or snapshots still reference it,
// and its removal, kept apart from creates that are starting on it. It is
// safe for concurrent use.
type Templates struct{ m *Manager }

// TemplateUsable reports whether template name exists and ctx's caller
// may use it (its tenant's own, or shared).
func (ts *Templates) TemplateUsable(ctx context.Context, name string) bool {
	if target, ok := storage.TemplateAlias(name); ok {
		name = target
	}
	return ts.TemplateExists(name) && ts.templateVisible(ctx, name)
}

// templateVisible reports whether ctx's caller may use template name: a
// built-in or shared one, or its tenant's own. A template without a
// record (an import that failed half-way) is forkbox's own only; one
// that does not exist at all is reported by launch.
func (ts *Templates) templateVisible(ctx context.Context, name string) bool {
	rec, err := ts.m.opts.Store.GetTemplate(ctx, name)
	if err != nil {
		_, caller := tenancy.From(ctx)
		return !caller || (errors.Is(err, errdefs.ErrNotFound) && !ts.TemplateExists(name))
	}
	return tenancy.Visible(ctx, rec.Tenant)
}

// RemoveTemplateIfUnused runs remove (which takes template name's files
// away) only if no live session uses name, and keeps creates from starting
// on name while it runs. ErrConflict when a session uses it.
func (ts *Templates) RemoveTemplateIfUnused(name string, remove func() error) error {
	ts.m.tplMu.Lock()
	defer ts.m.tplMu.Unlock()
	if ts.TemplateInUse(name) {
		return errdefs.Newf(errdefs.ErrConflict, "template %q is used by running sessions", name)
	}
	snaps, err := ts.m.opts.Store.ListSnapshots(context.Background())
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.Template == name {
			return errdefs.Newf(errdefs.ErrConflict, "template %q is the base of snapshot %s; delete the snapshot first", name, sn.ID)
		}
	}
	ts.m.warm.Drop(name)
	if err := remove(); err != nil {
		return err
	}
	return ts.m.opts.Storage.RemoveTemplate(context.Background(), name)
}

// TemplateExists reports whether template name is installed (false for an
// invalid name).
func (ts *Templates) TemplateExists(name string) bool {
	if !storage.ValidTemplateName(name) {
		return false
	}
	_, err := storage.LoadTemplate(ts.m.opts.Layout.Template(name))
	return err == nil
}

// TemplateInUse reports whether a live session (not counting warm-pool
// members, but counting a spare being given the template) runs on
// template name.
func (ts *Templates) TemplateInUse(name string) bool {
	ts.m.mu.Lock()
	defer ts.m.mu.Unlock()
	for _, sb := range ts.m.live {
		sb.mu.Lock()
		filling := sb.fillTemplate == name
		sb.mu.Unlock()
		if r := sb.Record(); filling || r.Template == name && r.State != node.StatePooled {
			return true
		}
	}
	return false
}

// TemplateReferenced reports whether a live session runs on template name
// or a snapshot is built on it (the overlay storage driver reads a
// snapshot's template files in place, so they must stay).
func (ts *Templates) TemplateReferenced(ctx context.Context, name string) bool {
	if ts.TemplateInUse(name) {
		return true
	}
	snaps, err := ts.m.opts.Store.ListSnapshots(ctx)
	if err != nil {
		return true // when in doubt, keep the template
	}
	for _, sn := range snaps {
		if sn.Template == name {
			return true
		}
	}
	return false
}
