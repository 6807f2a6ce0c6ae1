package snapshot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage/seal"
)

// Sealing after the answer. Sealing a memory checkpoint (AES-256-GCM,
// sha256 and an fsync of every sealed byte) took most of a memory
// snapshot call here (about 550-700 ms of 800-950 for 107 MB), so the
// call answers once the checkpoint is taken and the files snapshot is
// recorded, and the checkpoint is sealed in the background. Until then the
// snapshot's record has no memory digest (node.Snapshot.Sealing, shown as
// memory_state "sealing"): a restore or fork from it waits until the seal
// is done (awaitSealed) and then verifies and decrypts the sealed files
// as always, so nothing restores from plaintext that was not sealed first;
// a delete waits too. A seal that fails deletes the snapshot (the restores
// waiting for it fail with the error). A daemon that stops meanwhile waits
// for the seals under way (Close); one that died leaves records without a
// digest, which Reconcile deletes (their plaintext is gone with the
// scratch directory).

// pendingSeal is one memory checkpoint being sealed.
type pendingSeal struct {
	done chan struct{}
	err  error // set before done is closed
}

// plainBytes returns the bytes of the regular files in dir (a checkpoint
// in the clear: what SealDir seals and OpenDir gives back).
func plainBytes(dir string) (int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return 0, err
		}
		n += info.Size()
	}
	return n, nil
}

// beginSeal registers snapshot id's seal as under way; call before its
// record is stored, so that a restore that finds the record finds the
// seal too.
func (s *Service) beginSeal(id string) *pendingSeal {
	p := &pendingSeal{done: make(chan struct{})}
	s.sealMu.Lock()
	s.seals[id] = p
	s.sealMu.Unlock()
	return p
}

// awaitSeal waits until snapshot id's seal under way, if any, is done (or
// ctx ends) and returns its error; nil when none is under way.
func (s *Service) awaitSeal(ctx context.Context, id string) error {
	s.sealMu.Lock()
	p := s.seals[id]
	s.sealMu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitSealed returns snapshot sn itself when its memory is sealed, or
// else waits for its seal and returns the record read again (with its
// digest). ErrConflict when it is not sealed and no seal is under way (a
// daemon died while sealing it), or when its seal failed.
func (s *Service) awaitSealed(ctx context.Context, sn *node.Snapshot) (*node.Snapshot, error) {
	if !sn.Sealing() {
		return sn, nil
	}
	began := time.Now()
	if err := s.awaitSeal(ctx, sn.ID); err != nil {
		return nil, errdefs.Newf(errdefs.ErrConflict, "snapshot %s: its memory checkpoint could not be sealed: %v", sn.ID, err)
	}
	fresh, err := s.store.GetSnapshot(ctx, sn.ID)
	if err != nil {
		return nil, err
	}
	if fresh.Sealing() {
		return nil, errdefs.Newf(errdefs.ErrConflict, "snapshot %s: its memory checkpoint is not sealed", sn.ID)
	}
	s.log.Debug("restore waited for the seal", "snapshot", sn.ID, "wait_ms", ms(time.Since(began)))
	return fresh, nil
}

// sealLater seals mc's checkpoint into snapshot sn's memory directory in
// the background (sn is recorded, without a digest, and p registered),
// writing in the same pass a decrypted copy for the first restores when
// the image cache has room (keepImage), removes the plaintext and records
// the digest. On failure the snapshot is deleted. Then p is done and the
// sealed checkpoint is replicated.
// Once Close has begun waiting for seals (sealClosed), a seal starts in
// the caller's goroutine instead, so that no seal begins behind Close's
// wait.
func (s *Service) sealLater(mc *memoryCapture, sn node.Snapshot, p *pendingSeal) {
	s.sealMu.Lock()
	inline := s.sealClosed
	if !inline {
		s.seal.Add(1)
	}
	s.sealMu.Unlock()
	run := func() {
		if !inline {
			defer s.seal.Done()
		}
		began := time.Now()
		ctx := context.WithoutCancel(s.bgCtx)
		var copyTo string
		reserved := sn.MemoryBytes
		if s.cacheBytes > 0 && s.reserveCopy(reserved) {
			if err := datadir.EnsurePrivateDir(s.layout.Scratch()); err == nil {
				copyTo = filepath.Join(s.layout.Scratch(), "restore-"+sn.ID+"-"+node.NewID()[:8])
			} else {
				s.log.Warn("no image-cache copy of a memory snapshot", "snapshot", sn.ID, "err", err)
				s.unreserveCopy(reserved)
			}
		}
		err := s.sealMemory(mc, &sn, copyTo)
		os.RemoveAll(mc.dir)
		// Kept before the digest is recorded: a restore that finds it
		// finds the copy too.
		if copyTo != "" {
			if err == nil {
				s.keepImage(copyTo, &sn)
			}
			s.unreserveCopy(reserved)
		}
		if err == nil {
			err = s.store.SetMemorySealed(ctx, sn.ID, sn.MemoryDigest, sn.MemoryBytes)
		}
		if err != nil {
			s.log.Error("seal a memory snapshot: it is deleted", "snapshot", sn.ID, "session", sn.SessionID, "err", err)
			s.dropImage(sn.ID)
			_ = s.storage.RemoveSnapshot(ctx, sn.ID)
			if s.volumes != nil {
				if verr := s.volumes.DropSessionSnapshot(ctx, sn.ID); verr != nil {
					s.log.Error("drop the volumes of a snapshot whose seal failed", "snapshot", sn.ID, "err", verr)
				}
			}
			os.RemoveAll(s.memoryDir(sn.ID))
			if derr := s.store.DeleteSnapshot(ctx, sn.ID); derr != nil {
				s.log.Error("delete a snapshot whose seal failed", "snapshot", sn.ID, "err", derr)
			}
		}
		p.err = err
		s.sealMu.Lock()
		delete(s.seals, sn.ID)
		s.sealMu.Unlock()
		close(p.done)
		s.log.Debug("memory snapshot sealed", "snapshot", sn.ID, "bytes", sn.MemoryBytes,
			"seal_ms", ms(time.Since(began)), "copy_kept", copyTo != "", "ok", err == nil)
		if err == nil && !inline {
			s.replicate(&sn)
		}
	}
	if inline {
		run()
		return
	}
	go run()
}

// sealMemory seals the checkpoint into the snapshot's memory directory and
// fills sn's memory digest and size; the plaintext stays for the caller.
// Unless copyTo is "", the plaintext is also copied there in the same pass
// (seal.SealDirCopy; removed on failure).
func (s *Service) sealMemory(mc *memoryCapture, sn *node.Snapshot, copyTo string) error {
	if err := os.MkdirAll(s.layout.MemorySnapshots(), 0o700); err != nil {
		return err
	}
	digest, n, err := seal.SealDirCopy(s.key, mc.dir, s.memoryDir(sn.ID), copyTo)
	if err != nil {
		return fmt.Errorf("seal checkpoint: %w", err)
	}
	sn.MemoryDigest, sn.MemoryBytes = digest, n
	return nil
}

// keepImage puts dir, the plaintext of the checkpoint just sealed into
// snapshot sn's memory directory, in the image cache (images.go), so that
// the first restores skip decrypting it: the copy is what was sealed, and
// it is stamped with the sealed files as they are now, so it is used only
// while they stay so (as a copy kept after a restore). It is removed at
// once when the cache is over its bound.
func (s *Service) keepImage(dir string, sn *node.Snapshot) {
	stamp, err := stampDir(s.memoryDir(sn.ID))
	if err != nil {
		os.RemoveAll(dir)
		return
	}
	im := &openImage{id: sn.ID, ready: make(chan struct{}), dir: dir, bytes: sn.MemoryBytes, stamp: stamp, users: 1}
	close(im.ready)
	s.imgMu.Lock()
	if s.images[sn.ID] != nil {
		// Cannot be (restores wait for the seal); the one there wins.
		s.imgMu.Unlock()
		os.RemoveAll(dir)
		return
	}
	s.images[sn.ID] = im
	s.imgMu.Unlock()
	s.releaseImage(im) // unused: kept within the cache's bounds
}

// reserveCopy reserves n bytes of the image cache for a copy written
// while sealing, evicting the least recently used unused images to make
// room: the copies being written and the images kept unused stay within
// the cache's bound together (seals run at once, each writing its whole
// copy into the scratch tmpfs before it is kept). False when they would
// not fit even so (then no copy is written).
func (s *Service) reserveCopy(n int64) bool {
	if n > s.cacheBytes {
		return false // never kept: leave the cache as it is
	}
	s.imgMu.Lock()
	defer s.imgMu.Unlock()
	for {
		kept := s.copying
		var oldest *openImage
		for _, im := range s.images {
			if im.users > 0 {
				continue // a restore's, not the cache's
			}
			kept += im.bytes
			if oldest == nil || im.used.Before(oldest.used) {
				oldest = im
			}
		}
		if kept+n <= s.cacheBytes {
			s.copying += n
			return true
		}
		if oldest == nil {
			return false
		}
		s.removeLocked(oldest)
	}
}

// unreserveCopy returns n bytes reserved by reserveCopy.
func (s *Service) unreserveCopy(n int64) {
	s.imgMu.Lock()
	s.copying -= n
	s.imgMu.Unlock()
}
