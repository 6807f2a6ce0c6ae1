package snapshot

import (
	"context"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/changes"
)

// trees returns the storage driver's tree views (both drivers have them).
func (s *Service) trees() (storage.Trees, error) {
	t, ok := s.storage.(storage.Trees)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "the %s storage driver cannot show file trees for diffs and merges", s.storage.Name())
	}
	return t, nil
}

// openSnapshotTree opens snapshot id's tree; close releases it.
func (s *Service) openSnapshotTree(ctx context.Context, id string) (*changes.Tree, func(), error) {
	tv, err := s.trees()
	if err != nil {
		return nil, nil, err
	}
	dir, release, err := tv.SnapshotTree(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	t, err := changes.OpenTree(dir)
	if err != nil {
		release()
		return nil, nil, err
	}
	return t, func() { t.Close(); release() }, nil
}

// openLayerTree opens live session id's root filesystem.
func (s *Service) openLayerTree(ctx context.Context, id string) (*changes.Tree, error) {
	tv, err := s.trees()
	if err != nil {
		return nil, err
	}
	dir, err := tv.LayerTree(ctx, id)
	if err != nil {
		return nil, err
	}
	return changes.OpenTree(dir)
}

// SessionDiff lists what live session id changed relative to snapshot
// opts.Base (default: the one it started from), from the two trees'
// metadata (changes.Diff: one lstat per entry of each, contents read only
// for files whose times alone differ). The session keeps running, so the
// answer is a view of a moment: a write during the walk may or may not be
// in it. ErrInvalidArgument naming "base" when there is no base to
// default to.
func (s *Service) SessionDiff(ctx context.Context, id string, opts node.DiffOptions) (*node.Diff, error) {
	sb, err := s.core.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	rec := sb.Record()
	base := opts.Base
	if base == "" {
		if base = rec.Snapshot; base == "" {
			return nil, errdefs.InvalidField("base", "session %s started from a template, not a snapshot: name the snapshot to compare with", id)
		}
	}
	bs, err := s.Resolve(ctx, base)
	if err != nil {
		return nil, err
	}
	old, release, err := s.openSnapshotTree(ctx, bs.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	cur, err := s.openLayerTree(ctx, id)
	if err != nil {
		return nil, err
	}
	defer cur.Close()
	return diffTrees(ctx, bs.ID, old, cur, opts.Patch)
}

// SnapshotDiff lists what snapshot ref holds relative to snapshot
// opts.Base (default: its parent), as SessionDiff does.
func (s *Service) SnapshotDiff(ctx context.Context, ref string, opts node.DiffOptions) (*node.Diff, error) {
	sn, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	base := opts.Base
	if base == "" {
		if base = sn.Parent; base == "" {
			return nil, errdefs.InvalidField("base", "snapshot %s has no parent (its session started from a template): name the snapshot to compare with", sn.ID)
		}
	}
	bs, err := s.Resolve(ctx, base)
	if err != nil {
		return nil, err
	}
	old, release, err := s.openSnapshotTree(ctx, bs.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	cur, release2, err := s.openSnapshotTree(ctx, sn.ID)
	if err != nil {
		return nil, err
	}
	defer release2()
	return diffTrees(ctx, bs.ID, old, cur, opts.Patch)
}

// diffTrees compares old with cur and, with patch, renders the text
// files' unified diffs within node.MaxPatchBytes.
func diffTrees(ctx context.Context, base string, old, cur *changes.Tree, patch bool) (*node.Diff, error) {
	began := time.Now()
	res, err := changes.Diff(ctx, old, cur, changes.Options{})
	if err != nil {
		return nil, err
	}
	out := &node.Diff{Base: base, Entries: res.Stats.Entries, Compared: res.Stats.Compared,
		Changes: make([]node.FileChange, 0, len(res.Changes))}
	budget := node.MaxPatchBytes
	for _, c := range res.Changes {
		fc := fileChange(c)
		if patch && (fc.Kind == changes.KindFile || fc.OldKind == changes.KindFile) {
			if budget <= 0 {
				fc.PatchOmitted = true
			} else {
				p, err := changes.Patch(old, cur, c)
				if err != nil {
					return nil, err
				}
				fc.Binary, fc.TooLarge = p.Binary, p.TooLarge
				if len(p.Text) > budget {
					fc.PatchOmitted = true
				} else {
					fc.Patch = p.Text
					budget -= len(p.Text)
				}
			}
		}
		out.Changes = append(out.Changes, fc)
	}
	out.Elapsed = time.Since(began)
	return out, nil
}

// fileChange is c as the API shows it.
func fileChange(c changes.Change) node.FileChange {
	fc := node.FileChange{Path: "/" + c.Path, Op: c.Op}
	e := c.New
	if e == nil {
		e = c.Old
	}
	fc.Kind, fc.Size, fc.Mode, fc.Target = e.Kind, e.Size, e.Mode, e.Target
	if c.Op == changes.OpModified {
		fc.OldKind, fc.OldSize, fc.OldMode = c.Old.Kind, c.Old.Size, c.Old.Mode
	}
	return fc
}
