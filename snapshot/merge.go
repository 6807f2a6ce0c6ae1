package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage/changes"
)

// Merge applies what spec.From (a session or a snapshot) changed since
// the snapshot it shares with session id into session id: a three-way
// merge per path (changes.PlanMerge). A session From is first
// snapshotted (provisionally, deleted after), so its files are read as
// of one moment; session id is held (no pause, resume or snapshot of it)
// and frozen while the merge is planned and applied. The common snapshot
// is the newest one of From's history (snapshots taken of it, then the
// chain it started from) that is also in session id's. Applying is all
// or nothing, also across a daemon crash: changes.Apply stages every new
// file and a backup of every replaced one in the data directory's merges
// directory, journals the ops before the first change, rolls back on a
// failure, and Reconcile finishes or undoes a journal at start-up.
// Errors: ErrNotFound for an unknown (or another tenant's) session or
// From; ErrInvalidArgument naming "from" when they share no snapshot,
// "on_conflict" or "paths" when bad; *node.ConflictError (409) with
// on_conflict "fail" and conflicts, nothing changed.
func (s *Service) Merge(ctx context.Context, id string, spec node.MergeSpec) (*node.MergeResult, error) {
	resolve := spec.OnConflict
	switch resolve {
	case "":
		resolve = node.OnConflictFail
	case node.OnConflictFail, node.OnConflictOurs, node.OnConflictTheirs:
	default:
		return nil, errdefs.InvalidField("on_conflict", "must be fail, ours or theirs")
	}
	var only []string
	for _, p := range spec.Paths {
		rel, err := changes.CleanRel("paths", p)
		if err != nil {
			return nil, err
		}
		only = append(only, rel)
	}
	if spec.From == "" {
		return nil, errdefs.InvalidField("from", "is required: a session or snapshot id")
	}
	if spec.From == id {
		return nil, errdefs.InvalidField("from", "is the session itself")
	}
	tgt, err := s.core.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	ours, err := s.sessionHistory(ctx, tgt.ID, tgt.Snapshot, time.Time{})
	if err != nil {
		return nil, err
	}
	theirsSnap, theirs, cleanup, err := s.mergeSource(ctx, spec.From)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	base := ""
	for _, h := range theirs {
		if slices.Contains(ours, h) {
			base = h
			break
		}
	}
	if base == "" {
		return nil, errdefs.InvalidField("from", "session %s and %s share no snapshot (neither was forked from the other's or a common snapshot), so there is no base for a three-way merge", id, spec.From)
	}
	sb, err := s.core.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	sb.Lock()
	defer sb.Unlock()
	rec := sb.Record()
	if rec.State != node.StateRunning && rec.State != node.StatePaused {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, rec.State)
	}
	dir := filepath.Join(s.layout.Merges(), id)
	if _, err := os.Lstat(dir); err == nil {
		return nil, errdefs.Newf(errdefs.ErrConflict, "an interrupted merge into session %s awaits recovery (at the next daemon start)", id)
	}
	if rec.State == node.StateRunning {
		if err := sb.Driver().Pause(ctx, id); err != nil {
			return nil, fmt.Errorf("freeze for merge: %w", err)
		}
		defer func() {
			if err := sb.Driver().Resume(context.WithoutCancel(ctx), id); err != nil {
				s.log.Error("thaw after merge", "session", id, "err", err)
			}
		}()
	}
	return s.applyMerge(ctx, id, base, theirsSnap, only, resolve, dir)
}

// applyMerge plans and applies the merge into frozen session id.
func (s *Service) applyMerge(ctx context.Context, id, base, theirsSnap string, only []string, resolve, dir string) (*node.MergeResult, error) {
	bt, releaseBase, err := s.openSnapshotTree(ctx, base)
	if err != nil {
		return nil, err
	}
	defer releaseBase()
	tt, releaseTheirs, err := s.openSnapshotTree(ctx, theirsSnap)
	if err != nil {
		return nil, err
	}
	defer releaseTheirs()
	ot, err := s.openLayerTree(ctx, id)
	if err != nil {
		return nil, err
	}
	defer ot.Close()
	plan, err := changes.PlanMerge(ctx, bt, ot, tt, only, resolve)
	if err != nil {
		return nil, err
	}
	if len(plan.Conflicts) > 0 && resolve == node.OnConflictFail {
		slices.Sort(plan.Conflicts)
		return nil, &node.ConflictError{Paths: plan.Conflicts}
	}
	res := &node.MergeResult{Base: base, Conflicts: plan.Conflicts}
	if len(plan.Ops) == 0 {
		return res, nil
	}
	if err := os.MkdirAll(s.layout.Merges(), 0o700); err != nil {
		return nil, err
	}
	if err := changes.Apply(ctx, ot, tt, plan.Ops, dir); err != nil {
		return nil, err
	}
	for _, op := range plan.Ops {
		fc := node.FileChange{Path: "/" + op.Path, Op: changes.OpModified, Mode: op.Mode, Target: op.Target}
		switch op.Action {
		case changes.ActDelete:
			fc.Op = changes.OpDeleted
		case changes.ActWrite:
			fc.Kind = changes.KindFile
		case changes.ActMkdir:
			fc.Kind = changes.KindDir
		case changes.ActSymlink:
			fc.Kind = changes.KindSymlink
		}
		if op.Had == nil {
			fc.Op = changes.OpAdded
		} else if fc.Op == changes.OpDeleted {
			fc.Kind, fc.Mode = op.Had.Kind, op.Had.Mode
		}
		if op.Merged {
			res.Merged = append(res.Merged, fc.Path)
		}
		res.Applied = append(res.Applied, fc)
	}
	s.log.Info("merged", "session", id, "base", base, "from_snapshot", theirsSnap, "ops", len(plan.Ops),
		"conflicts", len(plan.Conflicts), "resolve", resolve)
	return res, nil
}

// mergeSource resolves a merge's From: a live session (snapshotted now,
// the snapshot deleted by cleanup) or a snapshot (whose integrity is
// checked first, as for a fork). It returns the snapshot
// to read, From's history (newest first) and cleanup.
func (s *Service) mergeSource(ctx context.Context, from string) (string, []string, func(), error) {
	nop := func() {}
	fs, err := s.core.Get(ctx, from)
	if err == nil {
		if fs.State != node.StateRunning && fs.State != node.StatePaused {
			return "", nil, nop, errdefs.InvalidField("from", "session %s is %s: merge from a snapshot of it", from, fs.State)
		}
		hist, err := s.sessionHistory(ctx, fs.ID, fs.Snapshot, time.Time{})
		if err != nil {
			return "", nil, nop, err
		}
		sn, err := s.take(ctx, fs.ID, node.SnapshotOptions{}, true)
		if err != nil {
			return "", nil, nop, err
		}
		return sn.ID, hist, func() {
			if err := s.DeleteSnapshot(context.WithoutCancel(ctx), sn.ID, false); err != nil {
				s.log.Warn("delete a merge's source snapshot", "snapshot", sn.ID, "err", err)
			}
		}, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return "", nil, nop, err
	}
	sn, err := s.Resolve(ctx, from)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", nil, nop, errdefs.Newf(errdefs.ErrNotFound, "from: no session or snapshot %q", from)
	}
	if err != nil {
		return "", nil, nop, err
	}
	// Its files are brought into a session: check them as a fork would.
	if err := s.storage.Verify(ctx, sn.ID); err != nil {
		return "", nil, nop, err
	}
	hist, err := s.sessionHistory(ctx, sn.SessionID, sn.Parent, sn.CreatedAt)
	if err != nil {
		return "", nil, nop, err
	}
	return sn.ID, append([]string{sn.ID}, hist...), nop, nil
}

// sessionHistory lists the snapshots in session id's past, newest first:
// those taken of it (up to before, when not zero), then the chain it
// started from (startedFrom, its parent, ...; a deleted link ends it).
func (s *Service) sessionHistory(ctx context.Context, id, startedFrom string, before time.Time) ([]string, error) {
	all, err := s.store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, sn := range all { // newest first
		if sn.SessionID == id && !sn.Provisional && (before.IsZero() || !sn.CreatedAt.After(before)) {
			out = append(out, sn.ID)
		}
	}
	for next, n := startedFrom, 0; next != "" && n < 1024; n++ {
		out = append(out, next)
		sn, err := s.store.GetSnapshot(ctx, next)
		if err != nil {
			break
		}
		next = sn.Parent
	}
	return out, nil
}

// recoverMerges finishes or undoes, at start-up, the merges a previous
// daemon left journaled (changes.Recover), with each target session held
// and frozen as during the merge.
func (s *Service) recoverMerges(ctx context.Context) {
	entries, _ := os.ReadDir(s.layout.Merges())
	for _, e := range entries {
		id, dir := e.Name(), filepath.Join(s.layout.Merges(), e.Name())
		if err := s.recoverMerge(ctx, id, dir); err != nil {
			s.log.Error("recover an interrupted merge", "session", id, "err", err)
			continue
		}
		s.log.Info("recovered an interrupted merge", "session", id)
	}
}

func (s *Service) recoverMerge(ctx context.Context, id, dir string) error {
	sb, err := s.core.Find(ctx, id)
	if err != nil {
		return changes.Recover(nil, dir) // its session is gone: nothing to finish
	}
	sb.Lock()
	defer sb.Unlock()
	if sb.Record().State == node.StateRunning {
		// The crashed merge may have left it frozen (then this pause
		// fails): either way it is thawed once the journal is done.
		_ = sb.Driver().Pause(ctx, id)
		defer func() {
			if err := sb.Driver().Resume(ctx, id); err != nil {
				s.log.Error("thaw after merge recovery", "session", id, "err", err)
			}
		}()
	}
	t, err := s.openLayerTree(ctx, id)
	if err != nil {
		return changes.Recover(nil, dir)
	}
	defer t.Close()
	return changes.Recover(t, dir)
}
