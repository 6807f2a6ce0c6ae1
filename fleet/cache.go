package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage/seal"
)

// Cache is a bounded local directory of sealed snapshots pulled from the
// fleet's object store (datadir.Layout.FleetCache): one directory per
// snapshot id, as sealed (still encrypted). When the snapshots it holds
// add up to more than its bound, the least recently used ones that no
// caller holds are removed first. Every Open verifies the copy against
// the snapshot's digest before handing it out. Safe for concurrent use.
type Cache struct {
	dir     string
	max     int64
	objects Objects

	mu      sync.Mutex
	entries map[string]*cacheEntry
	total   int64
	pulls   map[string]*pull // pulls under way, by id
}

type cacheEntry struct {
	size int64
	used time.Time
	pins int
}

// pull is one pull under way; others asking for the same id wait on it.
type pull struct {
	done chan struct{}
	err  error
}

// OpenCache opens the cache directory dir (made 0700 when missing),
// bounded to maxBytes (> 0), pulling from objects. What an earlier run
// left is kept, its last use the directories' modification times; copies
// half-pulled are removed.
func OpenCache(dir string, maxBytes int64, objects Objects) (*Cache, error) {
	if maxBytes <= 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--snapshot-cache-mb: must be at least 1")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c := &Cache{dir: dir, max: maxBytes, objects: objects, entries: map[string]*cacheEntry{}, pulls: map[string]*pull{}}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if strings.HasPrefix(de.Name(), ".") || !de.IsDir() || ValidID("id", de.Name()) != nil {
			if err := os.RemoveAll(p); err != nil {
				return nil, err
			}
			continue
		}
		fi, err := de.Info()
		if err != nil {
			return nil, err
		}
		size, err := dirSize(p)
		if err != nil {
			return nil, err
		}
		c.entries[de.Name()] = &cacheEntry{size: size, used: fi.ModTime()}
		c.total += size
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
	return c, nil
}

// Bytes is what the cache holds now, in bytes.
func (c *Cache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// IDs lists the snapshots the cache holds, least recently used first.
func (c *Cache) IDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]string, 0, len(c.entries))
	for id := range c.entries {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return c.entries[ids[i]].used.Before(c.entries[ids[j]].used) })
	return ids
}

// Open returns the directory holding snapshot id's sealed files, pulling
// it from the object store when the cache lacks it, and verifies it
// against digest (the manifest's, then each file's sha256) before
// returning. A cached copy that fails the check is removed and pulled
// again; one pulled that fails it is refused (ErrConflict) and nothing of
// it is kept. The directory stays until release is called (call it once
// the restore has read it); after that it may be evicted. ErrNotFound
// when the object store does not have id.
func (c *Cache) Open(ctx context.Context, id, digest string) (dir string, release func(), err error) {
	if err := ValidID("snapshot id", id); err != nil {
		return "", nil, err
	}
	dir = filepath.Join(c.dir, id)
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		if p, ok := c.pulls[id]; ok {
			c.mu.Unlock()
			select {
			case <-p.done:
			case <-ctx.Done():
				return "", nil, ctx.Err()
			}
			if p.err != nil && (ctx.Err() != nil || !isContextErr(p.err)) {
				return "", nil, p.err
			}
			continue // pulled, or its puller gave up: pull it here
		}
		e, ok := c.entries[id]
		if ok {
			e.pins++
			e.used = time.Now()
			c.mu.Unlock()
			_ = os.Chtimes(dir, e.used, e.used)
			if err := verifyDir(dir, digest); err != nil {
				c.drop(id)
				if attempt > 0 {
					return "", nil, err
				}
				continue // pull it again
			}
			return dir, c.releaser(id), nil
		}
		p := &pull{done: make(chan struct{})}
		c.pulls[id] = p
		c.mu.Unlock()
		p.err = c.pull(ctx, id, digest, dir)
		c.mu.Lock()
		delete(c.pulls, id)
		close(p.done)
		c.mu.Unlock()
		if p.err != nil {
			return "", nil, p.err
		}
		// Held from its pull on: an entry over what the bound leaves free
		// is not evicted before its caller has read it.
		return dir, c.releaser(id), nil
	}
}

// isContextErr reports whether err is a context's cancellation or
// deadline (one caller's, not the pull's own failure).
func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// pull copies id from the object store into dir (verified by Get) and
// adds it to the cache held once (the caller's pin), evicting what the
// bound asks for among the other entries.
func (c *Cache) pull(ctx context.Context, id, digest, dir string) error {
	if err := c.objects.Get(ctx, id, digest, dir); err != nil {
		return err
	}
	size, err := dirSize(dir)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[id] = &cacheEntry{size: size, used: time.Now(), pins: 1}
	c.total += size
	c.evictLocked()
	return nil
}

// releaser returns the release of one pin of id (once).
func (c *Cache) releaser(id string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if e, ok := c.entries[id]; ok && e.pins > 0 {
				e.pins--
			}
			c.evictLocked()
		})
	}
}

// drop removes id from the cache now (a copy that failed its check: its
// pins no longer count).
func (c *Cache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[id]; ok {
		c.total -= e.size
		delete(c.entries, id)
		os.RemoveAll(filepath.Join(c.dir, id))
	}
}

// evictLocked removes the least recently used unheld entries while the
// cache holds more than its bound.
func (c *Cache) evictLocked() {
	if c.total <= c.max {
		return
	}
	ids := make([]string, 0, len(c.entries))
	for id, e := range c.entries {
		if e.pins == 0 {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return c.entries[ids[i]].used.Before(c.entries[ids[j]].used) })
	for _, id := range ids {
		if c.total <= c.max {
			return
		}
		if err := os.RemoveAll(filepath.Join(c.dir, id)); err != nil {
			continue
		}
		c.total -= c.entries[id].size
		delete(c.entries, id)
	}
}

// Remove drops snapshot id from the cache (its snapshot was deleted); an
// id the cache lacks is fine. ErrConflict while a caller holds it.
func (c *Cache) Remove(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[id]
	if !ok {
		return nil
	}
	if e.pins > 0 {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot %s is in use from the cache", id)
	}
	if err := os.RemoveAll(filepath.Join(c.dir, id)); err != nil {
		return err
	}
	c.total -= e.size
	delete(c.entries, id)
	return nil
}

// verifyDir checks the sealed directory dir against digest: the
// manifest's digest, then each listed file's sha256 and that no other
// file is there. ErrConflict on any mismatch.
func verifyDir(dir, digest string) error {
	data, err := os.ReadFile(filepath.Join(dir, seal.ManifestName))
	if err != nil {
		return errdefs.Newf(errdefs.ErrConflict, "cached snapshot failed its integrity check: manifest: %v", err)
	}
	m, err := seal.ParseManifest(data, digest)
	if err != nil {
		return err
	}
	want := map[string]string{seal.ManifestName: ""}
	for _, f := range m.Files {
		want[f.Name] = f.SHA256
		got, err := fileSHA256(filepath.Join(dir, f.Name))
		if err != nil {
			return errdefs.Newf(errdefs.ErrConflict, "cached snapshot failed its integrity check: %s: %v", f.Name, err)
		}
		if got != f.SHA256 {
			return errdefs.Newf(errdefs.ErrConflict, "cached snapshot failed its integrity check: %s has sha256 %s, manifest %s", f.Name, got, f.SHA256)
		}
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		if _, ok := want[de.Name()]; !ok {
			return errdefs.Newf(errdefs.ErrConflict, "cached snapshot failed its integrity check: unexpected file %s", de.Name())
		}
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// dirSize is the bytes of the regular files directly in dir.
func dirSize(dir string) (int64, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, de := range des {
		fi, err := de.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n, nil
}

// String describes the cache for logs.
func (c *Cache) String() string {
	return fmt.Sprintf("fleet cache %s (%d of %d bytes)", c.dir, c.Bytes(), c.max)
}
