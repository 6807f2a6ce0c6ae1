package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage/seal"
)

// Decrypted memory checkpoints (images). A restore needs the checkpoint
// in the clear (in Layout.Scratch(), a tmpfs); the sessions of one fork
// share one decrypted copy. By default it is removed once the last of them
// has started, so plaintext exists only while a restore runs; with
// Options.ImageCacheBytes > 0 it is kept, up to that many bytes in all and
// ImageCacheIdle each, so that the next restores of a recently used
// snapshot skip the decryption (at the price of that plaintext staying in
// the host's memory meanwhile). A kept copy is used again only while every sealed file it
// came from is unchanged since it was verified (the same inode, size,
// modification and change time: any write or replacement changes the
// change time, which user space cannot set back); otherwise the copy is
// dropped and the sealed files are verified and decrypted again, so a
// tampered snapshot is refused as before. Deleting a snapshot drops its
// copy.

// ImageCacheIdle is how long a decrypted image is kept unused.
const ImageCacheIdle = 5 * time.Minute

// openImage is one snapshot's decrypted checkpoint.
type openImage struct {
	id    string // the snapshot's
	ready chan struct{}
	dir   string
	err   error
	bytes int64       // plaintext bytes, once ready
	stamp []fileStamp // the sealed files as verified
	users int         // restores using it now
	stale bool        // out of the map: removed when its last user is done
	idle  *time.Timer // drops it after ImageCacheIdle unused
	used  time.Time   // last release, for eviction order
}

// fileStamp identifies the state of one sealed file.
type fileStamp struct {
	name             string
	ino              uint64
	size             int64
	mtimeNs, ctimeNs int64
}

// stampDir stamps every file of sealed directory dir, by name.
func stampDir(dir string) ([]fileStamp, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]fileStamp, 0, len(entries))
	for _, e := range entries {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(dir, e.Name()), &st); err != nil {
			return nil, err
		}
		out = append(out, fileStamp{name: e.Name(), ino: st.Ino, size: st.Size,
			mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano()})
	}
	return out, nil
}

// sameStamps reports whether a and b stamp the same files alike.
func sameStamps(a, b []fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// OpenMemory verifies and decrypts snapshot sn's checkpoint, or joins a
// restore that did, or takes a copy kept from an earlier one whose sealed
// files are unchanged. It returns the directory, the generation its
// restored agents wait for (Generation) and a release function, to call
// once the runtime has read what it needs; the copy is then kept within
// the cache's bounds or removed. A tampered or truncated image is
// ErrConflict and nothing is started; ErrUnavailable without a snapshot
// key. A snapshot whose checkpoint is still being sealed (sealing.go) is
// waited for first.
func (s *Service) OpenMemory(sn *node.Snapshot) (string, uint64, func(), error) {
	sn, err := s.awaitSealed(context.Background(), sn)
	if err != nil {
		return "", 0, nil, err
	}
	for attempt := 0; ; attempt++ {
		im, first := s.joinImage(sn.ID)
		release := func() { s.releaseImage(im) }
		if first {
			s.decrypt(im, sn)
		} else {
			<-im.ready
		}
		if im.err != nil {
			release()
			return "", 0, nil, fmt.Errorf("snapshot %s: %w", sn.ID, im.err)
		}
		if first || attempt > 0 {
			return im.dir, Generation(sn.ID), release, nil
		}
		// A kept or shared copy: only while the sealed files are as
		// verified.
		now, err := stampDir(s.memoryDir(sn.ID))
		if err == nil && sameStamps(now, im.stamp) {
			s.log.Debug("memory image reused", "snapshot", sn.ID, "bytes", im.bytes)
			return im.dir, Generation(sn.ID), release, nil
		}
		s.log.Warn("sealed memory snapshot changed since it was verified: verifying it again", "snapshot", sn.ID)
		s.dropImage(sn.ID)
		release()
	}
}

// joinImage returns snapshot id's image, made (not ready) when there is
// none, with one more user; first says the caller must decrypt it.
func (s *Service) joinImage(id string) (*openImage, bool) {
	s.imgMu.Lock()
	defer s.imgMu.Unlock()
	im := s.images[id]
	first := im == nil
	if first {
		im = &openImage{id: id, ready: make(chan struct{})}
		s.images[id] = im
	}
	if im.idle != nil {
		im.idle.Stop()
		im.idle = nil
	}
	im.users++
	return im, first
}

// decrypt fills im from snapshot sn's sealed checkpoint and marks it ready.
func (s *Service) decrypt(im *openImage, sn *node.Snapshot) {
	defer close(im.ready)
	began := time.Now()
	im.dir = filepath.Join(s.layout.Scratch(), "restore-"+sn.ID+"-"+node.NewID()[:8])
	if err := datadir.EnsurePrivateDir(s.layout.Scratch()); err != nil {
		im.err = err
		return
	}
	if s.key == nil {
		im.err = fmt.Errorf("memory snapshots: %w: no snapshot key", errdefs.ErrUnavailable)
		return
	}
	// Stamped before reading: a change made while OpenDir reads is either
	// caught by it or changes the stamps.
	stamp, err := stampDir(s.memoryDir(sn.ID))
	if err != nil {
		im.err = err
		return
	}
	if im.err = seal.OpenDir(s.key, s.memoryDir(sn.ID), sn.MemoryDigest, im.dir); im.err != nil {
		return
	}
	im.stamp, im.bytes = stamp, sn.MemoryBytes
	s.log.Debug("memory image decrypted", "snapshot", sn.ID, "bytes", im.bytes, "decrypt_ms", ms(time.Since(began)))
}

// releaseImage drops one user of im; the last one keeps it in the cache
// or removes it.
func (s *Service) releaseImage(im *openImage) {
	s.imgMu.Lock()
	defer s.imgMu.Unlock()
	if im.users--; im.users > 0 {
		return
	}
	if im.stale || im.err != nil || im.bytes > s.cacheBytes {
		s.removeLocked(im)
		return
	}
	im.used = time.Now()
	im.idle = time.AfterFunc(ImageCacheIdle, func() {
		s.imgMu.Lock()
		defer s.imgMu.Unlock()
		if im.users == 0 && !im.stale && s.images[im.id] == im {
			s.removeLocked(im)
		}
	})
	s.evictLocked()
}

// evictLocked removes the least recently used unused images until those
// kept fit s.cacheBytes.
func (s *Service) evictLocked() {
	for {
		var kept int64
		var oldest *openImage
		for _, im := range s.images {
			if im.users > 0 {
				continue
			}
			kept += im.bytes
			if oldest == nil || im.used.Before(oldest.used) {
				oldest = im
			}
		}
		if kept <= s.cacheBytes || oldest == nil {
			return
		}
		s.removeLocked(oldest)
	}
}

// removeLocked takes im out of the map and removes its files (now if
// unused, else when its last user is done).
func (s *Service) removeLocked(im *openImage) {
	if s.images[im.id] == im {
		delete(s.images, im.id)
	}
	if im.idle != nil {
		im.idle.Stop()
		im.idle = nil
	}
	im.stale = true
	if im.users == 0 && im.dir != "" {
		if err := os.RemoveAll(im.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("remove a decrypted memory image", "snapshot", im.id, "err", err)
		}
	}
}

// dropImage removes snapshot id's decrypted image (once unused): the
// snapshot is deleted, or its sealed files changed.
func (s *Service) dropImage(id string) {
	s.imgMu.Lock()
	defer s.imgMu.Unlock()
	if im := s.images[id]; im != nil {
		s.removeLocked(im)
	}
}
