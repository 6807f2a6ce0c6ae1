package build

import (
	"context"
	"fmt"

	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// warmTier is the tier whose builds keep a started server in a memory
// snapshot (the one tier here whose driver restores processes).
const warmTier = "gvisor"

// warm gives template t, just installed, its memory snapshot when the
// build ran in warmTier and t has a start command: a session of t is
// created as any create makes one (the start command started, the
// ready check awaited), memory-snapshotted once ready (named
// "warm-NAME"), and destroyed; the snapshot is recorded as
// t.WarmSnapshot. This is what E2B's builder does at the end of a build
// with a start command. A create that fails (the ready check did not
// pass) fails the build: the caller removes the template.
func (r *run) warm(ctx context.Context, t *storage.Template) error {
	if r.spec.Isolation != warmTier || len(t.StartCmd) == 0 {
		return nil
	}
	r.emit(Event{Kind: "log", Stream: "stdout", Data: "starting the template's start command to keep it running in a memory snapshot\n"})
	s, _, err := r.b.node.Create(ctx, node.CreateSpec{Template: t.Name, Isolation: warmTier,
		Metadata: map[string]string{"forkbox.build": r.name}}, "")
	if err != nil {
		return fmt.Errorf("start the template's server: %w", err)
	}
	r.sandboxes++
	defer func() { _ = r.b.node.Destroy(context.WithoutCancel(ctx), s.ID) }()
	snap, err := r.b.node.Snapshot(ctx, s.ID, node.SnapshotOptions{Memory: true, Name: "warm-" + r.name})
	if err != nil {
		return fmt.Errorf("memory snapshot of the template's server: %w", err)
	}
	if err := r.b.catalog.SetWarmSnapshot(ctx, t.Name, snap.ID); err != nil {
		_ = r.b.node.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID, true)
		return err
	}
	t.WarmSnapshot = snap.ID
	r.emit(Event{Kind: "log", Stream: "stdout", Data: fmt.Sprintf("memory snapshot %s holds the started server\n", snap.ID)})
	return nil
}
