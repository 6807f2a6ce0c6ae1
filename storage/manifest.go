package storage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// MaxManifestDepth is the deepest directory nesting a manifest walk
// follows: the walk holds one descriptor per level. It is as deep as the
// path-based walk it replaced could go (PATH_MAX, 4096 bytes, allows no
// more than 2048 levels), so no recorded snapshot is deeper.
const MaxManifestDepth = 2048

// digested counts the entries every manifest walk of this process has
// read (see DigestedEntries).
var digested atomic.Int64

// DigestedEntries returns how many entries ManifestDigest has walked in
// this process since it started: the work of snapshot digests and
// integrity checks (a verified digest that a driver reuses costs none).
func DigestedEntries() int64 { return digested.Load() }

// ManifestDigest returns "sha256:<hex>" of the contents manifest of the
// directory tree at root and the number of entries in it. The manifest has
// one line per entry, sorted by path (bytes, as Go compares strings), with
// its type, permission bits, owner, group, size, device number (whiteouts
// are 0:0 character devices), symlink target, modification and change
// times in nanoseconds. Symlinks are not followed.
//
// Content is represented by size and times rather than hashed, so that a
// snapshot of a large sandbox is digested in the time of one walk; any
// later change to a file's content or metadata sets its change time
// (ctime), which no system call can set back, so a tampered snapshot does
// not match.
//
// The walk streams: it reads one directory at a time (with descriptors,
// never long paths), orders its entries so that the lines come out in the
// manifest's global path order, and hashes each line as it goes. Memory
// is that of the largest directory's names, not of the tree, and the
// digest is the one the earlier collect-then-sort walk recorded (existing
// snapshots keep verifying).
//
// maxEntries > 0 stops the walk once the tree holds more entries than
// that, with an error wrapping errdefs.ErrResourceExhausted that names
// the limit; a tree nested deeper than MaxManifestDepth is the same
// class. ctx's cancellation stops the walk.
func ManifestDigest(ctx context.Context, root string, maxEntries int64) (string, int64, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", 0, fmt.Errorf("manifest of %s: %w", root, err)
	}
	defer unix.Close(fd)
	w := &manifestWalk{ctx: ctx, h: sha256.New(), max: maxEntries, dirent: make([]byte, 32<<10)}
	err = w.dir(fd, nil, 1)
	digested.Add(w.entries)
	switch {
	case err == nil:
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return "", w.entries, err
	case ctx.Err() != nil:
		return "", w.entries, ctx.Err()
	default:
		return "", w.entries, fmt.Errorf("manifest of %s: %w", root, err)
	}
	return "sha256:" + hex.EncodeToString(w.h.Sum(nil)), w.entries, nil
}

// manifestWalk is the state of one ManifestDigest walk.
type manifestWalk struct {
	ctx     context.Context
	h       hash.Hash
	max     int64
	entries int64
	line    []byte // the line being written, reused
	path    []byte // the path of the entry being written, reused
	link    []byte // readlink buffer, reused
	dirent  []byte // getdents buffer, reused (a directory is read whole before the walk goes down)
}

// Kinds of a dirItem.
const (
	itemEntry   = iota // the entry's own manifest line, at key name
	itemSubtree        // a directory's contents, at key name + "/"
	itemSelf           // the walk's root directory's own line, at key "."
)

// dirItem is one thing a directory contributes to the manifest, in the
// order of its key. Names live in the directory's names buffer.
type dirItem struct {
	off  uint32
	n    uint8 // name length (names are at most 255 bytes)
	kind uint8
}

// dir writes the manifest lines of the directory open as fd, whose path
// relative to the root (with a trailing slash; nil for the root) is
// prefix, at nesting depth depth. The lines of a directory's children and
// of their subtrees interleave by key: a child's line sorts at its name,
// its subtree at name + "/" (no name holds a slash, so no other key falls
// inside a subtree's range), and the root's own line at ".". Sorting
// these keys per directory gives exactly the global path order.
func (w *manifestWalk) dir(fd int, prefix []byte, depth int) error {
	if depth > MaxManifestDepth {
		return errdefs.Newf(errdefs.ErrResourceExhausted, "directories nested deeper than %d levels", MaxManifestDepth)
	}
	names, items, err := w.readDir(fd, prefix == nil)
	if err != nil {
		return fmt.Errorf("read %s: %w", pathOf(prefix, "."), err)
	}
	slices.SortFunc(items, func(a, b dirItem) int { return compareKeys(names, a, b) })
	for _, it := range items {
		name := names[it.off : it.off+uint32(it.n)]
		switch it.kind {
		case itemSelf:
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				return fmt.Errorf("stat .: %w", err)
			}
			if err := w.emit([]byte("."), &st, nil); err != nil {
				return err
			}
		case itemEntry:
			if err := w.entry(fd, prefix, string(name)); err != nil {
				return err
			}
		case itemSubtree:
			sub, err := unix.Openat(fd, string(name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s: %w", pathOf(prefix, string(name)), err)
			}
			p := append(append(append(make([]byte, 0, len(prefix)+len(name)+1), prefix...), name...), '/')
			err = w.dir(sub, p, depth+1)
			unix.Close(sub)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// entry writes the line of fd's entry name.
func (w *manifestWalk) entry(fd int, prefix []byte, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s: %w", pathOf(prefix, name), err)
	}
	var target []byte
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		if w.link == nil {
			w.link = make([]byte, unix.PathMax)
		}
		n, err := unix.Readlinkat(fd, name, w.link)
		if err != nil {
			return fmt.Errorf("read link %s: %w", pathOf(prefix, name), err)
		}
		target = w.link[:n]
	}
	w.path = append(append(w.path[:0], prefix...), name...)
	return w.emit(w.path, &st, target)
}

// emit hashes the manifest line of the entry at path (relative to the
// root) with stat st and symlink target: the bytes the original format
// wrote, "path\x00mode(octal)\x00uid\x00gid\x00size\x00rdev\x00target\x00
// mtime-ns\x00ctime-ns\n", directories with size 0 (their sizes vary by
// filesystem and history).
func (w *manifestWalk) emit(path []byte, st *unix.Stat_t, target []byte) error {
	w.entries++
	if w.max > 0 && w.entries > w.max {
		return errdefs.Newf(errdefs.ErrResourceExhausted,
			"the files hold more than %d entries (files, directories, links), the most a snapshot may hold; remove some and snapshot again", w.max)
	}
	if w.entries%4096 == 0 {
		if err := w.ctx.Err(); err != nil {
			return err
		}
	}
	size := st.Size
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		size = 0
	}
	l := append(w.line[:0], path...)
	l = append(l, 0)
	l = strconv.AppendUint(l, uint64(st.Mode), 8)
	l = append(l, 0)
	l = strconv.AppendUint(l, uint64(st.Uid), 10)
	l = append(l, 0)
	l = strconv.AppendUint(l, uint64(st.Gid), 10)
	l = append(l, 0)
	l = strconv.AppendInt(l, size, 10)
	l = append(l, 0)
	l = strconv.AppendUint(l, uint64(st.Rdev), 10)
	l = append(l, 0)
	l = append(l, target...)
	l = append(l, 0)
	l = strconv.AppendInt(l, st.Mtim.Nano(), 10)
	l = append(l, 0)
	l = strconv.AppendInt(l, st.Ctim.Nano(), 10)
	l = append(l, '\n')
	w.line = l
	_, err := w.h.Write(l)
	return err
}

// readDir reads the whole directory open as fd and returns its names (one
// buffer) and the items they contribute: each entry's line and, for a
// directory, its subtree; with self, the root's own line too. The type
// comes from getdents(2), or from a stat where the filesystem does not
// say.
func (w *manifestWalk) readDir(fd int, self bool) ([]byte, []dirItem, error) {
	var names []byte
	var items []dirItem
	if self {
		names = append(names, '.')
		items = append(items, dirItem{off: 0, n: 1, kind: itemSelf})
	}
	for {
		n, err := unix.Getdents(fd, w.dirent)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if n <= 0 {
			return names, items, nil
		}
		for b := w.dirent[:n]; len(b) > 0; {
			// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
			if len(b) < 19 {
				return nil, nil, fmt.Errorf("short directory record")
			}
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return nil, nil, fmt.Errorf("bad directory record length %d", reclen)
			}
			typ := b[18]
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			b = b[reclen:]
			if string(name) == "." || string(name) == ".." {
				continue
			}
			if len(name) > 255 {
				return nil, nil, fmt.Errorf("name of %d bytes", len(name))
			}
			isDir := typ == unix.DT_DIR
			if typ == unix.DT_UNKNOWN {
				var st unix.Stat_t
				if err := unix.Fstatat(fd, string(name), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return nil, nil, fmt.Errorf("stat %q: %w", name, err)
				}
				isDir = st.Mode&unix.S_IFMT == unix.S_IFDIR
			}
			off := uint32(len(names))
			names = append(names, name...)
			items = append(items, dirItem{off: off, n: uint8(len(name)), kind: itemEntry})
			if isDir {
				items = append(items, dirItem{off: off, n: uint8(len(name)), kind: itemSubtree})
			}
		}
	}
}

// compareKeys orders a and b by their keys: the name, followed by "/" for
// a subtree.
func compareKeys(names []byte, a, b dirItem) int {
	an := names[a.off : a.off+uint32(a.n)]
	bn := names[b.off : b.off+uint32(b.n)]
	m := min(len(an), len(bn))
	if c := bytes.Compare(an[:m], bn[:m]); c != 0 {
		return c
	}
	// One name is a prefix of the other (or they are equal): compare what
	// follows it in each key; a key that ends sorts first.
	next := func(name []byte, kind uint8) (byte, bool) {
		if len(name) > m {
			return name[m], true
		}
		if kind == itemSubtree {
			return '/', true
		}
		return 0, false
	}
	ca, okA := next(an, a.kind)
	cb, okB := next(bn, b.kind)
	switch {
	case !okA && !okB:
		return 0
	case !okA:
		return -1
	case !okB:
		return 1
	case ca != cb:
		return int(ca) - int(cb)
	}
	// The same byte follows: either both are '/' after equal names (the
	// same subtree, impossible) or the longer name continues past the
	// shorter's subtree slash, which no name holds.
	return len(an) - len(bn)
}

// pathOf is prefix + name, for messages.
func pathOf(prefix []byte, name string) string {
	if prefix == nil {
		return name
	}
	return string(prefix) + name
}
