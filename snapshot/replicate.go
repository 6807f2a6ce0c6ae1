package snapshot

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// Replicas is where sealed memory checkpoints are copied once sealed,
// off the host that made them: the fleet's object store (fleet.Objects).
// What is copied is the sealed directory as it is on disk, still
// encrypted.
type Replicas interface {
	// Put copies the sealed directory dir, whose manifest digest is
	// digest, as snapshot id's replica (fleet.Objects.Put).
	Put(ctx context.Context, id, dir, digest string) error
	// Delete removes snapshot id's replica; none is fine.
	Delete(ctx context.Context, id string) error
}

// replicateTimeout bounds one background copy.
const replicateTimeout = 30 * time.Minute

// replicate copies sn's sealed memory checkpoint to the replicas in the
// background and then records when (node.Snapshot.MemoryReplicatedAt).
// A snapshot deleted meanwhile has its replica deleted again; a failed
// copy is logged and the snapshot stays local (the copy is not retried
// yet).
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
		began := time.Now()
		if err := s.replicas.Put(ctx, id, s.memoryDir(id), digest); err != nil {
			if _, gerr := s.store.GetSnapshot(context.WithoutCancel(ctx), id); errors.Is(gerr, errdefs.ErrNotFound) {
				return // deleted while it was copied
			}
			s.log.Warn("copy of a memory snapshot to the fleet's object store failed; it stays on this host only",
				"snapshot", id, "err", err)
			return
		}
		err := s.store.SetMemoryReplicated(context.WithoutCancel(ctx), id, time.Now().UTC())
		if errors.Is(err, errdefs.ErrNotFound) {
			// Deleted while it was copied: its delete may have run before
			// the copy ended.
			s.forgetReplica(id)
			return
		}
		if err != nil {
			s.log.Warn("record a memory snapshot's copy", "snapshot", id, "err", err)
			return
		}
		s.log.Info("memory snapshot copied to the fleet's object store", "snapshot", id, "ms", ms(time.Since(began)))
	}()
}

// removeMemory removes snapshot id's sealed checkpoint, and its replica
// when it had one.
func (s *Service) removeMemory(id string) error {
	dir := s.memoryDir(id)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	s.forgetReplica(id)
	return nil
}

// forgetReplica deletes snapshot id's replica in the background (its
// snapshot is gone).
func (s *Service) forgetReplica(id string) {
	if s.replicas == nil {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.bgCtx), time.Minute)
		defer cancel()
		if err := s.replicas.Delete(ctx, id); err != nil {
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
