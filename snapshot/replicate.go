package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// Replicas is the fleet's copy of this host's snapshots, off the host
// that took them (the fleet's object store, fleet.Objects, and its
// directory, fleet.Directory), and the way to other hosts' snapshots.
// What is copied is sealed, still encrypted with the snapshot key.
type Replicas interface {
	// Put copies the sealed memory checkpoint directory dir, whose
	// manifest digest is digest, as snapshot id's (fleet.Objects.Put).
	Put(ctx context.Context, id, dir, digest string) error
	// PutFiles copies sn's sealed files export dir (manifest digest
	// digest; export.go), then records in the fleet's directory that sn
	// is replicated with that digest: another host can restore it once
	// this returns nil.
	PutFiles(ctx context.Context, sn *node.Snapshot, dir, digest string) error
	// Delete removes what the fleet holds of snapshot id (its memory
	// checkpoint, its files export and its directory entry) when id is
	// this host's (an imported copy's removal leaves the fleet's copy
	// alone); none is fine.
	Delete(ctx context.Context, id string) error
	// Replicated reports whether the fleet's directory says this host's
	// snapshot id is copied (true too when the entry is another host's:
	// there is nothing for this host to copy).
	Replicated(ctx context.Context, id string) (bool, error)
	// Locate returns the tenant of snapshot id and the digest of its
	// files export when the fleet's directory says another host's copy
	// of it is replicated; ErrNotFound when there is none.
	Locate(ctx context.Context, id string) (tenant, digest string, err error)
	// OpenFiles and OpenMemory return the sealed directory of snapshot
	// id's files export or memory checkpoint, pulled into the bounded
	// local cache and verified against digest before they return
	// (fleet.Cache.Open; ErrConflict when it fails its integrity check),
	// and the release to call once it is read.
	OpenFiles(ctx context.Context, id, digest string) (dir string, release func(), err error)
	OpenMemory(ctx context.Context, id, digest string) (dir string, release func(), err error)
}

// replicateTimeout bounds one background copy.
const replicateTimeout = 30 * time.Minute

// replicate copies sn's sealed memory checkpoint to the replicas in the
// background, records when (node.Snapshot.MemoryReplicatedAt), and then
// copies its files (copyFiles). A snapshot deleted meanwhile has its
// replica deleted again; a failed copy is logged and the snapshot stays
// local until the next start (resumeCopies).
func (s *Service) replicate(sn *node.Snapshot) {
	if s.replicas == nil || sn.MemoryDigest == "" {
		return
	}
	id, digest := sn.ID, sn.MemoryDigest
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.bgCtx, replicateTimeout)
		defer cancel()
		if !s.copyMemory(ctx, id, digest) {
			return
		}
		fresh, err := s.store.GetSnapshot(ctx, id)
		if err != nil {
			return
		}
		s.copyFiles(ctx, fresh)
	}()
}

// copyMemory copies snapshot id's sealed checkpoint (manifest digest
// digest) and records the copy; it reports whether both were done.
func (s *Service) copyMemory(ctx context.Context, id, digest string) bool {
	began := time.Now()
	if err := s.whileUnavailable(ctx, id, func() error { return s.replicas.Put(ctx, id, s.memoryDir(id), digest) }); err != nil {
		if _, gerr := s.store.GetSnapshot(context.WithoutCancel(ctx), id); errors.Is(gerr, errdefs.ErrNotFound) {
			return false // deleted while it was copied
		}
		s.log.Warn("copy of a memory snapshot to the fleet's object store failed; it stays on this host only",
			"snapshot", id, "err", err)
		return false
	}
	err := s.store.SetMemoryReplicated(context.WithoutCancel(ctx), id, time.Now().UTC())
	if errors.Is(err, errdefs.ErrNotFound) {
		// Deleted while it was copied: its delete may have run before
		// the copy ended.
		s.forgetReplica(id)
		return false
	}
	if err != nil {
		s.log.Warn("record a memory snapshot's copy", "snapshot", id, "err", err)
		return false
	}
	s.log.Info("memory snapshot copied to the fleet's object store", "snapshot", id, "ms", ms(time.Since(began)))
	return true
}

// resumeCopies copies, one after the other in the background, this
// host's snapshots the fleet has no copy of (Replicas.Replicated): those
// whose copy a stopped daemon did not finish or that failed. Provisional
// snapshots and checkpoints still sealing are left to their own copy;
// imported ones are another host's (its delete must not be undone here).
func (s *Service) resumeCopies(ctx context.Context) {
	if s.replicas == nil || s.key == nil {
		return
	}
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		s.log.Warn("list snapshots to copy to the fleet", "err", err)
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		for _, sn := range snaps {
			if s.bgCtx.Err() != nil {
				return
			}
			if sn.Provisional || sn.Sealing() || s.imported(sn.ID) {
				continue
			}
			ctx, cancel := context.WithTimeout(s.bgCtx, replicateTimeout)
			var done bool
			err := s.whileUnavailable(ctx, sn.ID, func() (err error) {
				done, err = s.replicas.Replicated(ctx, sn.ID)
				return err
			})
			switch {
			case err != nil:
				s.log.Warn("ask the fleet whether a snapshot is copied", "snapshot", sn.ID, "err", err)
			case done:
			case sn.MemoryDriver != "" && sn.MemoryReplicatedAt.IsZero():
				if s.copyMemory(ctx, sn.ID, sn.MemoryDigest) {
					s.copyFiles(ctx, sn)
				}
			default:
				s.copyFiles(ctx, sn)
			}
			cancel()
		}
	}()
}

// replicateFiles copies files snapshot sn's export to the replicas in the
// background (the snapshot call does not wait for it); a memory
// snapshot's goes after its checkpoint (replicate). A failed copy is
// logged and the snapshot stays on this host only.
func (s *Service) replicateFiles(sn node.Snapshot) {
	if s.replicas == nil || s.key == nil {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.bgCtx, replicateTimeout)
		defer cancel()
		s.copyFiles(ctx, &sn)
	}()
}

// copyFiles exports sn's files (export.go), copies the export and
// records it replicated; the export's staging directory is removed after.
func (s *Service) copyFiles(ctx context.Context, sn *node.Snapshot) {
	began := time.Now()
	dir := filepath.Join(s.layout.FleetExports(), sn.ID)
	defer os.RemoveAll(dir)
	gone := func() bool {
		_, err := s.store.GetSnapshot(context.WithoutCancel(ctx), sn.ID)
		return errors.Is(err, errdefs.ErrNotFound)
	}
	digest, n, err := s.exportFiles(ctx, sn, dir)
	if err != nil {
		if !gone() {
			s.log.Warn("export of a snapshot's files for the fleet failed; it stays on this host only", "snapshot", sn.ID, "err", err)
		}
		return
	}
	exported := time.Now()
	if err := s.whileUnavailable(ctx, sn.ID, func() error { return s.replicas.PutFiles(ctx, sn, dir, digest) }); err != nil {
		if !gone() {
			s.log.Warn("copy of a snapshot's files to the fleet's object store failed; it stays on this host only", "snapshot", sn.ID, "err", err)
		}
		return
	}
	if gone() {
		s.forgetReplica(sn.ID) // deleted while it was copied
		return
	}
	s.log.Info("snapshot files copied to the fleet's object store", "snapshot", sn.ID, "bytes", n,
		"export_ms", ms(exported.Sub(began)), "copy_ms", ms(time.Since(exported)))
}

// removeMemory removes snapshot id's sealed checkpoint (DeleteSnapshot
// then forgets its replicas).
func (s *Service) removeMemory(id string) error {
	if err := os.Remove(s.importedSource(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	dir := s.memoryDir(id)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return os.RemoveAll(dir)
}

// forgetReplica deletes what the fleet holds of snapshot id in the
// background (its snapshot is gone; Replicas.Delete): again while the
// fleet is not available (no quorum), until the daemon stops or
// replicateTimeout passes; an attempt under way when it stops is not cut
// short (a minute at most).
func (s *Service) forgetReplica(id string) {
	if s.replicas == nil {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.bgCtx, replicateTimeout)
		defer cancel()
		err := s.whileUnavailable(ctx, id, func() error {
			actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer acancel()
			return s.replicas.Delete(actx, id)
		})
		if err != nil {
			s.log.Warn("delete a snapshot's copy in the fleet's object store", "snapshot", id, "err", err)
		}
	}()
}

// Close waits for the memory checkpoints being sealed (sealing.go; a seal
// that begins after this call runs in its caller, not replicated), then
// stops the background copies (one cut short leaves its snapshot local,
// not recorded as copied) and waits for them and for the replica deletes
// under way. Safe to call more than once.
func (s *Service) Close() {
	s.sealMu.Lock()
	s.sealClosed = true
	s.sealMu.Unlock()
	s.seal.Wait()
	s.bgCancel()
	s.bg.Wait()
}

// whileUnavailable runs f, again every 2 s while it fails with
// ErrUnavailable (a cluster still electing, a quorum briefly lost), until
// ctx ends.
func (s *Service) whileUnavailable(ctx context.Context, id string, f func() error) error {
	for {
		err := f()
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) {
			return err
		}
		s.log.Debug("the fleet is not available for a snapshot's copy yet; retrying", "snapshot", id, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(2 * time.Second):
		}
	}
}
