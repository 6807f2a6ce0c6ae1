package changes

import (
	"context"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Ops of a Change.
const (
	OpAdded    = "added"
	OpModified = "modified"
	OpDeleted  = "deleted"
)

// MaxDepth is the deepest directory nesting Diff follows (it holds two
// descriptors per level).
const MaxDepth = 1024

// DefaultMaxChanges bounds the changes one Diff returns when Options
// leave it 0.
const DefaultMaxChanges = 100000

// Change is one path that differs between an old and a new tree. Old is
// nil for an added path, New for a deleted one; a path whose kind changed
// (a file replaced by a directory) is one modified Change, the old
// directory's contents are deleted Changes and the new one's added.
type Change struct {
	Path string
	Op   string
	Old  *Entry
	New  *Entry
}

// Options tune Diff.
type Options struct {
	// MaxChanges > 0 bounds the changes (DefaultMaxChanges when 0); more
	// is ErrResourceExhausted.
	MaxChanges int
}

// Stats is what a Diff cost: Entries lstat'ed in both trees, and the
// regular files whose contents it compared (those whose metadata differed
// only in their times).
type Stats struct {
	Entries  int64
	Compared int64
}

// Result is Diff's answer: the changes depth first (a directory before
// its contents, the names of one directory in byte order) and the cost.
type Result struct {
	Changes []Change
	Stats   Stats
}

// Diff lists what differs from tree old to tree new. Two entries at one
// path are the same when kind, mode, owner, size, symlink target and
// device agree and, for regular files, also the modification and change
// times, or else the contents (compared only then). Directories differ
// only by mode or owner (their times change with every entry added). The
// cost is one lstat per entry of each tree plus the reads of those
// compared files; nothing else is read. ctx's cancellation stops it.
func Diff(ctx context.Context, old, new *Tree, opts Options) (*Result, error) {
	if opts.MaxChanges <= 0 {
		opts.MaxChanges = DefaultMaxChanges
	}
	d := &differ{ctx: ctx, old: old, new: new, max: opts.MaxChanges}
	ofd, err := old.OpenDir("", false)
	if err != nil {
		return nil, fmt.Errorf("open old tree: %w", err)
	}
	defer unix.Close(ofd)
	nfd, err := new.OpenDir("", false)
	if err != nil {
		return nil, fmt.Errorf("open new tree: %w", err)
	}
	defer unix.Close(nfd)
	if err := d.dir(ofd, nfd, "", 1); err != nil {
		return nil, err
	}
	return &Result{Changes: d.out, Stats: d.stats}, nil
}

// differ is the state of one Diff.
type differ struct {
	ctx      context.Context
	old, new *Tree
	max      int
	out      []Change
	stats    Stats
}

func (d *differ) add(c Change) error {
	if len(d.out) >= d.max {
		return errdefs.Newf(errdefs.ErrResourceExhausted, "more than %d changed paths", d.max)
	}
	d.out = append(d.out, c)
	return nil
}

// join is prefix/name ("" prefix: name).
func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "/" + name
}

// dir compares the directories open as ofd (old) and nfd (new) at rel.
// Either may be -1 (absent: everything in the other is added or deleted).
func (d *differ) dir(ofd, nfd int, rel string, depth int) error {
	if depth > MaxDepth {
		return errdefs.Newf(errdefs.ErrResourceExhausted, "directories nested deeper than %d levels", MaxDepth)
	}
	if err := d.ctx.Err(); err != nil {
		return err
	}
	var onames, nnames []string
	var err error
	if ofd >= 0 {
		if onames, err = storage.ReadDirNames(ofd); err != nil {
			return fmt.Errorf("read old %q: %w", "/"+rel, err)
		}
	}
	if nfd >= 0 {
		if nnames, err = storage.ReadDirNames(nfd); err != nil {
			return fmt.Errorf("read new %q: %w", "/"+rel, err)
		}
	}
	names := append(onames, nnames...)
	slices.Sort(names)
	names = slices.Compact(names)
	for _, name := range names {
		p := join(rel, name)
		var oe, ne *Entry
		if ofd >= 0 {
			if e, err := statAt(ofd, name, p); err == nil {
				oe = &e
			} else if err != unix.ENOENT {
				return fmt.Errorf("stat old %q: %w", "/"+p, err)
			}
		}
		if nfd >= 0 {
			if e, err := statAt(nfd, name, p); err == nil {
				ne = &e
			} else if err != unix.ENOENT {
				return fmt.Errorf("stat new %q: %w", "/"+p, err)
			}
		}
		d.stats.Entries += int64(btoi(oe != nil) + btoi(ne != nil))
		if err := d.entry(ofd, nfd, name, p, oe, ne, depth); err != nil {
			return err
		}
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// entry compares one name of the directories ofd and nfd.
func (d *differ) entry(ofd, nfd int, name, p string, oe, ne *Entry, depth int) error {
	switch {
	case oe == nil && ne == nil:
		return nil // gone meanwhile
	case ne == nil:
		if err := d.add(Change{Path: p, Op: OpDeleted, Old: oe}); err != nil {
			return err
		}
	case oe == nil:
		if err := d.add(Change{Path: p, Op: OpAdded, New: ne}); err != nil {
			return err
		}
	default:
		same, err := d.same(p, oe, ne)
		if err != nil {
			return err
		}
		if !same {
			if err := d.add(Change{Path: p, Op: OpModified, Old: oe, New: ne}); err != nil {
				return err
			}
		}
	}
	// Go down where either side is a directory.
	osub, nsub := -1, -1
	if oe != nil && oe.Kind == KindDir {
		fd, err := unix.Openat(ofd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open old %q: %w", "/"+p, err)
		}
		defer unix.Close(fd)
		osub = fd
	}
	if ne != nil && ne.Kind == KindDir {
		fd, err := unix.Openat(nfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open new %q: %w", "/"+p, err)
		}
		defer unix.Close(fd)
		nsub = fd
	}
	if osub < 0 && nsub < 0 {
		return nil
	}
	return d.dir(osub, nsub, p, depth+1)
}

// same reports whether entries a (old) and b (new) at p are the same.
func (d *differ) same(p string, a, b *Entry) (bool, error) {
	if a.Kind != b.Kind || a.Mode != b.Mode || a.UID != b.UID || a.GID != b.GID {
		return false, nil
	}
	switch a.Kind {
	case KindDir:
		return true, nil
	case KindSymlink:
		return a.Target == b.Target, nil
	case KindOther:
		return a.Rdev == b.Rdev, nil
	}
	if a.Size != b.Size {
		return false, nil
	}
	if a.Mtime == b.Mtime && a.Ctime == b.Ctime {
		return true, nil
	}
	d.stats.Compared++
	return SameContent(d.old, p, d.new, p)
}
