package volume

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
)

// Capture is the volumes of one session snapshot being taken: each
// read-write mount is snapshotted (storage snapshot of the volume's
// layer) in the same frozen window as the session's own layer, so that
// the volume and the session's files agree; each read-only mount is only
// recorded (the sessions restored from the snapshot mount the same volume
// read-only again). Use: BeginCapture before the freeze, Freeze while the
// sandbox is frozen, then Finish (or Abort) after the thaw.
type Capture struct {
	s     *Service
	items []*captureItem
	wg    sync.WaitGroup
}

// captureItem is one mount of a Capture.
type captureItem struct {
	row      store.VolumeSnapshotRow
	layer    string // "" for a read-only mount
	captured chan struct{}
	info     storage.SnapshotInfo
	err      error
}

// BeginCapture prepares the capture of session snapshot snapID's volumes,
// the mounts ms of a session of tenant (nil, nil when there are none).
// ErrConflict when a volume mounted read-write is gone.
func (s *Service) BeginCapture(ctx context.Context, tenant, snapID string, ms []node.VolumeMount) (*Capture, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	if err := s.supported(); err != nil {
		return nil, err
	}
	c := &Capture{s: s}
	for _, m := range ms {
		it := &captureItem{row: store.VolumeSnapshotRow{ID: node.NewID(), Tenant: tenant, Volume: m.Name,
			SessionSnapshot: snapID, Path: m.Path, ReadOnly: m.ReadOnly}}
		if !m.ReadOnly {
			r, err := s.store.GetVolume(ctx, tenant, m.Name)
			if errors.Is(err, errdefs.ErrNotFound) {
				return nil, errdefs.Newf(errdefs.ErrConflict, "volume %q the session mounts is gone", m.Name)
			}
			if err != nil {
				return nil, err
			}
			it.layer, it.row.SizeMB = r.LayerID, r.SizeMB
			it.captured = make(chan struct{})
		}
		c.items = append(c.items, it)
	}
	return c, nil
}

// Freeze snapshots the read-write volumes; the caller has frozen the
// session (or it is paused). It returns once every volume's files are
// captured (their digests go on in the background until Finish), or with
// the first error.
func (c *Capture) Freeze(ctx context.Context) error {
	if c == nil {
		return nil
	}
	// Buffered for every volume: a snapshot that fails after Freeze
	// returned must not block.
	done := make(chan struct{}, len(c.items))
	for _, it := range c.items {
		if it.layer == "" {
			continue
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			it.info, it.err = c.s.storage.Snapshot(ctx, it.layer, storageSnapshot(it.row.ID), func() { close(it.captured) })
			if it.err != nil {
				done <- struct{}{}
			}
		}()
	}
	for _, it := range c.items {
		if it.layer == "" {
			continue
		}
		select {
		case <-it.captured:
		case <-done:
			c.wg.Wait()
			for _, it := range c.items {
				if it.err != nil {
					return it.err
				}
			}
		}
	}
	return nil
}

// Finish waits for the snapshots' digests and records every mount under
// the session snapshot (before the caller records the session snapshot
// itself: the start-up sweep removes rows whose session snapshot never
// was). On an error nothing of the capture is left.
func (c *Capture) Finish(ctx context.Context) error {
	if c == nil {
		return nil
	}
	c.wg.Wait()
	for _, it := range c.items {
		if it.err != nil {
			c.Abort(ctx)
			return fmt.Errorf("snapshot of volume %q: %w", it.row.Volume, it.err)
		}
	}
	for _, it := range c.items {
		it.row.SizeBytes, it.row.CreatedAt = it.info.SizeBytes, now()
		if err := c.s.store.CreateVolumeSnapshot(ctx, it.row); err != nil {
			c.Abort(ctx)
			return err
		}
	}
	return nil
}

// Abort removes what the capture made (after Finish too: the session
// snapshot could not be recorded).
func (c *Capture) Abort(ctx context.Context) {
	if c == nil {
		return
	}
	c.wg.Wait()
	ctx = context.WithoutCancel(ctx)
	for _, it := range c.items {
		_ = c.s.store.DeleteVolumeSnapshot(ctx, it.row.ID)
		if it.layer != "" {
			_ = c.s.storage.RemoveSnapshot(ctx, storageSnapshot(it.row.ID))
		}
	}
}

// SnapshotMounts returns the volume mounts session snapshot snapID
// recorded, for a session restored from it: read-only ones as they were,
// read-write ones with Snapshot set to the volume snapshot its copy is
// made from (CopyForSession). None: nil.
func (s *Service) SnapshotMounts(ctx context.Context, snapID string) ([]node.VolumeMount, error) {
	rows, err := s.store.SessionSnapshotVolumes(ctx, snapID)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	out := make([]node.VolumeMount, 0, len(rows))
	for _, r := range rows {
		m := node.VolumeMount{Name: r.Volume, Path: r.Path, ReadOnly: r.ReadOnly}
		if !r.ReadOnly {
			m.Snapshot = r.ID
		}
		out = append(out, m)
	}
	return out, nil
}

// CopyForSession makes the volume session mounts for m, a read-write
// mount restored from a session snapshot (m.Snapshot set): a new volume
// of tenant named after the volume and the session ("NAME-SESSION",
// the name shortened to fit), a btrfs snapshot of the volume as the
// session snapshot captured it, with the volume's quota then. The copy is
// the session's: it is removed when the session ends (DropCopies). It
// returns m with the copy's name and Snapshot cleared.
func (s *Service) CopyForSession(ctx context.Context, tenant, session string, m node.VolumeMount) (node.VolumeMount, error) {
	sn, err := s.store.GetVolumeSnapshot(ctx, tenant, m.Snapshot)
	if err == nil && (sn.ReadOnly || sn.SessionSnapshot == "") {
		err = errdefs.Newf(errdefs.ErrNotFound, "volume snapshot %q", m.Snapshot)
	}
	if err != nil {
		return m, fmt.Errorf("volume %q of the snapshot: %w", m.Name, err)
	}
	name := copyName(m.Name, session)
	if _, err := s.create(ctx, tenant, name, sn.SizeMB, sourceOf(sn), session); err != nil {
		return m, err
	}
	m.Name, m.Snapshot = name, ""
	return m, nil
}

// copyName is the name of session's copy of volume name: NAME-SESSION,
// or, when that passes 63 characters, NAME shortened with 8 hex digits
// of its sha256 in place of its tail, so that two long names sharing
// their first characters still give two names.
func copyName(name, session string) string {
	if len(name)+1+len(session) <= 63 {
		return name + "-" + session
	}
	sum := sha256.Sum256([]byte(name))
	keep := max(63-1-len(session)-1-8, 1)
	return name[:keep] + "-" + hex.EncodeToString(sum[:4]) + "-" + session
}

// DropCopies removes the volumes that are session's copies (it ended),
// logging what it cannot remove (the next start's ReclaimCopies retries).
func (s *Service) DropCopies(ctx context.Context, session string, log *slog.Logger) {
	rows, err := s.store.ListVolumes(ctx, "")
	if err != nil {
		log.Warn("list volumes to drop a session's copies", "session", session, "err", err)
		return
	}
	for _, r := range rows {
		if r.Session == session {
			if err := s.Remove(ctx, r.Tenant, r.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				log.Warn("remove a session's volume copy", "session", session, "volume", r.Name, "err", err)
			}
		}
	}
}

// ReclaimCopies removes, at start-up once the live sessions are adopted,
// the copies whose session is not live (it ended while no daemon ran, or
// its teardown could not remove them).
func (s *Service) ReclaimCopies(ctx context.Context, live func(session string) bool, log *slog.Logger) {
	rows, err := s.store.ListVolumes(ctx, "")
	if err != nil {
		log.Warn("list volumes to reclaim copies", "err", err)
		return
	}
	for _, r := range rows {
		if r.Session != "" && !live(r.Session) {
			s.DropCopies(ctx, r.Session, log)
		}
	}
}

// DropSessionSnapshot removes the volume snapshots of session snapshot
// snapID (it is being deleted). Copies made from them keep their data.
func (s *Service) DropSessionSnapshot(ctx context.Context, snapID string) error {
	rows, err := s.store.SessionSnapshotVolumes(ctx, snapID)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range rows {
		errs = append(errs, s.dropSnapshot(ctx, r))
	}
	return errors.Join(errs...)
}

// ReconcileSessionSnapshots removes, at start-up, the volume snapshots
// of session snapshots that were never recorded (a daemon that stopped
// between recording the volumes and the session snapshot) or are gone;
// exists reports whether a session snapshot is recorded.
func (s *Service) ReconcileSessionSnapshots(ctx context.Context, exists func(snapID string) bool, log *slog.Logger) {
	rows, err := s.store.ListVolumeSnapshots(ctx, "", "", false)
	if err != nil {
		log.Warn("list volume snapshots", "err", err)
		return
	}
	for _, r := range rows {
		if r.SessionSnapshot != "" && !exists(r.SessionSnapshot) {
			if err := s.dropSnapshot(ctx, r); err != nil {
				log.Warn("remove an orphaned volume snapshot", "id", r.ID, "err", err)
			}
		}
	}
}
