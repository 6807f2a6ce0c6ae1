// Package changes compares file trees as a sandbox sees them — a
// session's writable layer, a snapshot — and reads their files safely from
// the host: every path is resolved relative to a directory descriptor of
// the tree's root, beneath it and never through a symlink (openat2 with
// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), and final components are
// examined with calls that do not follow links. A symlink in a tree is an
// entry like any other (its target is reported, never followed).
//
// Diff (diff.go) finds what differs from the entries' metadata: one
// lstat per entry of both trees, no content read except for regular files
// whose size, mode and owner agree but whose times differ (then the two
// contents are compared to tell a touch from an edit). Patch (patch.go)
// renders a unified diff of one changed text file, bounded in size.
package changes

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Kinds of an Entry.
const (
	KindFile    = "file"
	KindDir     = "dir"
	KindSymlink = "symlink"
	// KindOther is a device, FIFO or socket.
	KindOther = "other"
)

// Entry is one entry of a tree as lstat(2) shows it.
type Entry struct {
	// Path is relative to the tree's root, slash-separated, without a
	// leading slash.
	Path string
	Kind string
	// Mode is the permission bits with setuid, setgid and sticky (07777).
	Mode uint32
	// UID and GID are the owner on the host (shifted ids).
	UID, GID uint32
	// Size is in bytes (0 for a directory).
	Size int64
	// Target is a symlink's target, as stored (never followed).
	Target string
	// Rdev is a device's number.
	Rdev uint64
	// Mtime and Ctime are modification and change times, in nanoseconds.
	Mtime, Ctime int64
}

// Tree is a directory tree opened for reading by descriptor. Close it.
type Tree struct {
	fd int
}

// OpenTree opens the tree rooted at dir (not followed if dir itself is a
// symlink). Errors are the open's.
func OpenTree(dir string) (*Tree, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open tree: %w", err)
	}
	return &Tree{fd: fd}, nil
}

// Close releases the tree's descriptor.
func (t *Tree) Close() error { return unix.Close(t.fd) }

// FD is the descriptor of the tree's root (owned by t).
func (t *Tree) FD() int { return t.fd }

// CleanRel checks p, a path inside a sandbox ("/etc/x" or "etc/x"), and
// returns it relative to the root ("etc/x"; "" for the root). A path with
// "." or ".." components, empty components or a NUL byte is
// ErrInvalidArgument naming field.
func CleanRel(field, p string) (string, error) {
	rel := strings.TrimPrefix(p, "/")
	rel = strings.TrimSuffix(rel, "/")
	if strings.IndexByte(rel, 0) >= 0 {
		return "", errdefs.InvalidField(field, "%q holds a NUL byte", p)
	}
	if rel == "" {
		return "", nil
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			return "", errdefs.InvalidField(field, "%q is not a clean absolute path inside the sandbox", p)
		}
	}
	return rel, nil
}

// split splits rel into its parent ("" for the root) and final name.
func split(rel string) (string, string) {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i], rel[i+1:]
	}
	return "", rel
}

// OpenDir opens directory rel of t (O_PATH when path is true, else for
// reading) beneath the root and through no symlink; the caller closes the
// descriptor. ENOENT, ENOTDIR and ELOOP are the open's errors.
func (t *Tree) OpenDir(rel string, path bool) (int, error) {
	if rel == "" {
		rel = "."
	}
	flags := uint64(unix.O_DIRECTORY | unix.O_CLOEXEC)
	if path {
		flags |= unix.O_PATH
	} else {
		flags |= unix.O_RDONLY
	}
	how := unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for try := 0; ; try++ {
		fd, err := unix.Openat2(t.fd, rel, &how)
		if (err == unix.EAGAIN || err == unix.EINTR) && try < 16 {
			continue
		}
		return fd, err
	}
}

// Lstat returns the entry at rel without following it; ok is false (err
// nil) when rel or one of its parents does not exist or a parent is not a
// directory (a symlink is not a directory here).
func (t *Tree) Lstat(rel string) (e Entry, ok bool, err error) {
	dir, name := split(rel)
	if rel == "" {
		dir, name = "", "."
	}
	dfd, err := t.OpenDir(dir, true)
	if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
		return e, false, nil
	}
	if err != nil {
		return e, false, fmt.Errorf("open parent of %q: %w", rel, err)
	}
	defer unix.Close(dfd)
	e, err = statAt(dfd, name, rel)
	if err == unix.ENOENT {
		return e, false, nil
	}
	return e, err == nil, err
}

// statAt lstats name in directory dfd and returns it as the entry at rel.
func statAt(dfd int, name, rel string) (Entry, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Entry{}, err
	}
	e := Entry{Path: rel, Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid, Size: st.Size,
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Kind = KindFile
	case unix.S_IFDIR:
		e.Kind, e.Size = KindDir, 0
	case unix.S_IFLNK:
		e.Kind = KindSymlink
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return Entry{}, err
		}
		e.Target = string(buf[:n])
	default:
		e.Kind, e.Rdev = KindOther, st.Rdev
	}
	return e, nil
}

// Open opens regular file rel of t for reading, never through or at a
// symlink and never a FIFO or device (ErrInvalidArgument when rel is not
// a regular file).
func (t *Tree) Open(rel string) (*os.File, error) {
	dir, name := split(rel)
	dfd, err := t.OpenDir(dir, true)
	if err != nil {
		return nil, fmt.Errorf("open parent of %q: %w", rel, err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %q: %w", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%q is not a regular file", "/"+rel)
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// ReadFile reads regular file rel of t (see Open) whole when it holds at
// most max bytes; more is ErrResourceExhausted.
func (t *Tree) ReadFile(rel string, max int64) ([]byte, error) {
	f, err := t.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, errdefs.Newf(errdefs.ErrResourceExhausted, "%q is larger than %d bytes", "/"+rel, max)
	}
	return b, nil
}

// SameContent reports whether regular files rel of a and rel of b hold the
// same bytes (read in step, stopping at the first difference).
func SameContent(a *Tree, arel string, b *Tree, brel string) (bool, error) {
	fa, err := a.Open(arel)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := b.Open(brel)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea == io.EOF || ea == io.ErrUnexpectedEOF {
			return eb == io.EOF || eb == io.ErrUnexpectedEOF, nil
		}
		if ea != nil {
			return false, ea
		}
		if eb != nil {
			return false, eb
		}
	}
}
