// Package layercache keeps the compressed layers (blobs) of images pulled
// from registries, once each by digest, so that a second template from an
// image sharing layers with one pulled before downloads only the layers
// it does not share.
//
// The cache is a directory the daemon owns (datadir.Layout.Layers):
//
//	DIR/sha256/HEX        a blob whose content hashes to sha256:HEX (0600)
//	DIR/sha256/HEX.json   the registries that served it (Meta)
//	DIR/tmp/              downloads under way (emptied by Open)
//
// A blob is only ever put in place whole: it is written to DIR/tmp while
// its digest is computed, and renamed into place once the digest and size
// match (never a partial or unverified blob under a digest's name). The
// modification time of a blob is when it was last used; it orders
// eviction.
//
// The cache is bounded: Evict removes the least recently used blobs that
// no template uses (the inUse function Open is given) and no pull holds
// (Pin), until the blobs add up to at most the bound. Blobs a template
// uses are never evicted, so the cache can hold more than its bound when
// templates use more.
package layercache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/keyed"
	"github.com/forkbox/forkbox/storage"
)

// DefaultMaxBytes is the bound of a cache nobody sized: 10 GiB.
const DefaultMaxBytes = 10 << 30

// Cache is a bounded, digest-addressed store of layer blobs. It is safe
// for concurrent use, also by several pulls of the same digest (one
// downloads, the others wait and find it).
type Cache struct {
	dir   string
	max   int64
	inUse func(context.Context) (map[string]bool, error)

	locks keyed.Mutex // by digest: one writer (or evicter) at a time
	evict sync.Mutex  // one eviction at a time

	mu   sync.Mutex
	pins map[string]int // digest -> holders (pulls under way)
}

// Meta is what the cache knows of a blob beside its content.
type Meta struct {
	// Registries are the registries (host[:port], as the references
	// name them) that served the blob's content; a pull from another
	// registry downloads the blob again before it counts as held (see
	// Ensure).
	Registries []string `json:"registries"`
}

// Open opens the cache in dir (made, mode 0700, when missing), bounded to
// maxBytes of blobs (<= 0: DefaultMaxBytes). inUse returns the digests
// ("sha256:HEX") that templates use now; Evict never removes those. What
// an interrupted download left in DIR/tmp, and metadata without its blob,
// are removed.
func Open(dir string, maxBytes int64, inUse func(context.Context) (map[string]bool, error)) (*Cache, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	for _, d := range []string{dir, filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("layer cache: %w", err)
		}
	}
	tmp := filepath.Join(dir, "tmp")
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(tmp, e.Name())); err != nil {
			return nil, fmt.Errorf("layer cache: %w", err)
		}
	}
	c := &Cache{dir: dir, max: maxBytes, inUse: inUse, pins: map[string]int{}}
	blobs, err := c.list()
	if err != nil {
		return nil, err
	}
	held := map[string]bool{}
	for _, b := range blobs {
		held[b.digest] = true
	}
	for _, alg := range c.algorithms() {
		ents, _ := os.ReadDir(filepath.Join(dir, alg))
		for _, e := range ents {
			if h, ok := strings.CutSuffix(e.Name(), ".json"); ok && !held[alg+":"+h] {
				_ = os.Remove(filepath.Join(dir, alg, e.Name()))
			}
		}
	}
	return c, nil
}

// MaxBytes is the cache's bound, in bytes.
func (c *Cache) MaxBytes() int64 { return c.max }

// path is where blob d is kept; d must be valid (checkDigest).
func (c *Cache) path(d v1.Hash) string { return filepath.Join(c.dir, d.Algorithm, d.Hex) }

// checkDigest refuses a digest whose algorithm is not sha256 or sha512
// or whose hex is not of that algorithm's length (so that no digest names
// a path outside the cache). ErrInvalidArgument.
func checkDigest(d v1.Hash) error {
	n := map[string]int{"sha256": 64, "sha512": 128}[d.Algorithm]
	if n == 0 || len(d.Hex) != n || strings.Trim(d.Hex, "0123456789abcdef") != "" {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "layer digest %q is not a sha256 or sha512 digest", d.String())
	}
	return nil
}

// Pin keeps blob d from eviction until release is called (once; more
// calls do nothing). d need not be held yet: a pull pins the layers it
// is about to fetch, and keeps them pinned until the template that uses
// them is recorded.
func (c *Cache) Pin(d v1.Hash) (release func()) {
	key := d.String()
	c.mu.Lock()
	c.pins[key]++
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if c.pins[key]--; c.pins[key] <= 0 {
				delete(c.pins, key)
			}
			c.mu.Unlock()
		})
	}
}

// pinned reports whether a pull holds d.
func (c *Cache) pinned(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pins[key] > 0
}

// Stat reports whether blob d is held, with its size in bytes and its
// metadata.
func (c *Cache) Stat(d v1.Hash) (size int64, meta Meta, ok bool) {
	if checkDigest(d) != nil {
		return 0, Meta{}, false
	}
	fi, err := os.Stat(c.path(d))
	if err != nil || !fi.Mode().IsRegular() {
		return 0, Meta{}, false
	}
	_ = storage.ReadJSON(c.path(d)+".json", &meta, "layer metadata")
	return fi.Size(), meta, true
}

// Open opens held blob d for reading and marks it used now.
// ErrNotFound when it is not held.
func (c *Cache) Open(d v1.Hash) (*os.File, error) {
	if err := checkDigest(d); err != nil {
		return nil, err
	}
	f, err := os.Open(c.path(d))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "layer %s in the layer cache", d)
	}
	if err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	now := time.Now()
	_ = os.Chtimes(c.path(d), now, now)
	return f, nil
}

// MismatchError is a blob whose content did not hash to its digest, or
// was not as long as its descriptor said: the source served something
// else. Nothing of it is kept.
type MismatchError struct {
	// Want is the digest asked for; Got what the content hashed to ("" when
	// the size was wrong and the hash was not finished).
	Want, Got string
	// WantSize and GotSize are the sizes in bytes (WantSize -1: unknown).
	WantSize, GotSize int64
}

// Error says what did not match.
func (e *MismatchError) Error() string {
	if e.Got == "" {
		return fmt.Sprintf("layer %s: %d bytes served, its descriptor says %d", e.Want, e.GotSize, e.WantSize)
	}
	return fmt.Sprintf("layer %s: the content served hashes to %s", e.Want, e.Got)
}

// Source is how Ensure gets a blob it does not hold (or may not reuse):
// Registry names where it comes from, Open returns its content (the
// compressed bytes), Granted (nil: never reuse) says whether the registry
// lets this caller read a blob the cache holds from it already (a HEAD of
// the blob with the caller's credentials).
type Source struct {
	Registry string
	Open     func() (io.ReadCloser, error)
	Granted  func() (bool, error)
}

// Ensure makes blob d (of size bytes; -1: unknown) held and reports
// whether it was held already (nothing downloaded). A held blob is
// reused only if src.Registry served it before and src.Granted says the
// registry lets this caller read it: a blob is never handed to a caller
// that has not proven it may read it (another tenant's private layer
// named by digest in a manifest of one's own is downloaded, from one's
// own registry, and must hash the same). Otherwise src.Open's content is
// written to DIR/tmp, hashed as it streams (progress, when set, is
// called with the bytes read so far), and renamed into place only when
// its digest and size match: *MismatchError otherwise (wrapped), and the
// partial file is removed. ctx cancels the copy. The caller pins d
// (Pin) for as long as it needs the blob.
func (c *Cache) Ensure(ctx context.Context, d v1.Hash, size int64, src Source, progress func(int64)) (held bool, err error) {
	if err := checkDigest(d); err != nil {
		return false, err
	}
	unlock := c.locks.Lock(d.String())
	defer unlock()
	if _, meta, ok := c.Stat(d); ok && src.Granted != nil && slices.Contains(meta.Registries, src.Registry) {
		granted, err := src.Granted()
		if err != nil {
			return false, err
		}
		if granted {
			now := time.Now()
			_ = os.Chtimes(c.path(d), now, now)
			return true, nil
		}
	}
	tmp, err := c.download(ctx, d, size, src.Open, progress)
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp) // (gone once renamed)
	if err := os.MkdirAll(filepath.Join(c.dir, d.Algorithm), 0o700); err != nil {
		return false, fmt.Errorf("layer cache: %w", err)
	}
	var meta Meta
	_ = storage.ReadJSON(c.path(d)+".json", &meta, "layer metadata")
	if !slices.Contains(meta.Registries, src.Registry) {
		meta.Registries = append(meta.Registries, src.Registry)
	}
	if err := storage.WriteJSON(c.path(d)+".json", meta, 0o600); err != nil {
		return false, fmt.Errorf("layer cache: %w", err)
	}
	if err := os.Rename(tmp, c.path(d)); err != nil {
		return false, fmt.Errorf("layer cache: %w", err)
	}
	return false, nil
}

// download copies open's content into a new file in DIR/tmp, checks it
// against d and size, syncs it and returns its path. On error the file
// is removed.
func (c *Cache) download(ctx context.Context, d v1.Hash, size int64, open func() (io.ReadCloser, error), progress func(int64)) (_ string, retErr error) {
	rc, err := open()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	tmp := filepath.Join(c.dir, "tmp", d.Hex[:12]+"-"+hex.EncodeToString(b))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("layer cache: %w", err)
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	h, err := v1.Hasher(d.Algorithm)
	if err != nil {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "layer %s: %v", d, err)
	}
	var n int64
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		k, rerr := rc.Read(buf)
		if k > 0 {
			if size >= 0 && n+int64(k) > size {
				return "", &MismatchError{Want: d.String(), WantSize: size, GotSize: n + int64(k)}
			}
			h.Write(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				return "", writeErr(err)
			}
			n += int64(k)
			if progress != nil {
				progress(n)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// The source's own check (go-containerregistry verifies
			// what it reads too) fails at the end: say what we saw.
			if got := hex.EncodeToString(h.Sum(nil)); size >= 0 && n == size && got != d.Hex {
				return "", &MismatchError{Want: d.String(), Got: d.Algorithm + ":" + got, WantSize: size, GotSize: n}
			}
			return "", rerr
		}
	}
	if size >= 0 && n != size {
		return "", &MismatchError{Want: d.String(), WantSize: size, GotSize: n}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != d.Hex {
		return "", &MismatchError{Want: d.String(), Got: d.Algorithm + ":" + got, WantSize: size, GotSize: n}
	}
	if err := f.Sync(); err != nil {
		return "", writeErr(err)
	}
	if err := f.Close(); err != nil {
		return "", writeErr(err)
	}
	return tmp, nil
}

// writeErr classes a write error: a full disk is ErrInsufficientStorage.
func writeErr(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("layer cache: %w: %w", errdefs.ErrInsufficientStorage, err)
	}
	return fmt.Errorf("layer cache: %w", err)
}

// blob is one held blob as list finds it.
type blob struct {
	digest string
	path   string
	size   int64
	used   time.Time
}

// algorithms are the digest algorithms the cache keeps blobs of.
func (c *Cache) algorithms() []string { return []string{"sha256", "sha512"} }

// list returns every held blob.
func (c *Cache) list() ([]blob, error) {
	var out []blob
	for _, alg := range c.algorithms() {
		dir := filepath.Join(c.dir, alg)
		ents, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("layer cache: %w", err)
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".json") || !e.Type().IsRegular() {
				continue
			}
			d := v1.Hash{Algorithm: alg, Hex: e.Name()}
			if checkDigest(d) != nil {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, blob{digest: d.String(), path: filepath.Join(dir, e.Name()), size: fi.Size(), used: fi.ModTime()})
		}
	}
	return out, nil
}

// Usage returns the bytes the held blobs take and how many there are.
func (c *Cache) Usage() (bytes int64, blobs int, err error) {
	bs, err := c.list()
	for _, b := range bs {
		bytes += b.size
	}
	return bytes, len(bs), err
}

// Evict removes the least recently used blobs that no template uses and
// no pull has pinned until the held blobs add up to at most the bound,
// and returns the digests removed. Blobs in use are never removed, even
// when they alone are over the bound. inUse's error stops it before
// anything is removed.
func (c *Cache) Evict(ctx context.Context) (removed []string, err error) {
	c.evict.Lock()
	defer c.evict.Unlock()
	bs, err := c.list()
	if err != nil {
		return nil, err
	}
	var total int64
	for _, b := range bs {
		total += b.size
	}
	if total <= c.max {
		return nil, nil
	}
	used := map[string]bool{}
	if c.inUse != nil {
		if used, err = c.inUse(ctx); err != nil {
			return nil, fmt.Errorf("layer cache: which layers templates use: %w", err)
		}
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].used.Before(bs[j].used) })
	for _, b := range bs {
		if total <= c.max {
			break
		}
		if used[b.digest] {
			continue
		}
		// Under the digest's lock no Ensure is using it; a pull pins
		// before it calls Ensure, so a pin taken now is seen here or its
		// Ensure finds the blob gone and downloads it again.
		unlock := c.locks.Lock(b.digest)
		if c.pinned(b.digest) {
			unlock()
			continue
		}
		err := os.Remove(b.path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(b.path + ".json")
			total -= b.size
			removed = append(removed, b.digest)
		}
		unlock()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("layer cache: %w", err)
		}
	}
	return removed, nil
}
