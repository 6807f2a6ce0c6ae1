package changes

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Change archives. WriteTar writes what Diff found from a base tree to a
// tree as a tar stream (PAX format, so names, times in nanoseconds and
// ids of any length survive): every added or modified entry with its
// mode, owner (host ids, as on disk), modification time and, for a
// regular file, its contents; every deleted path as an empty entry
// carrying the PAX record DeletedKey. ApplyTar makes a copy of the base
// tree into the same tree as the archive's source by applying such a
// stream to it. Hard links are archived as separate files, extended
// attributes are not carried, and sockets are skipped (none of them is
// a snapshot's content a restore relies on); a directory's times are
// not kept (Diff ignores them).

// DeletedKey is the PAX record (value "1") of an entry of a change
// archive that deletes its path.
const DeletedKey = "FORKBOX.deleted"

// Bounds of a change archive's file contents against what its files
// take on disk: a sparse file, or one file under many hard links, is
// written whole each time, so a tree (a sandbox's) could otherwise make an
// archive thousands of times the size of its disk use.
const (
	// ArchiveSlack is the contents any archive may hold beyond its
	// files' allocation (bytes).
	ArchiveSlack = 64 << 20
	// EntrySlack is what each entry adds to that (bytes): a file
	// stored inline in its filesystem's metadata allocates no block.
	EntrySlack = 4 << 10
)

// WriteTar writes the changes chs (Diff's, from a base tree to tree t)
// to w as a change archive, reading the files' contents from t. Memory is
// bounded by one copy buffer, not by the files' sizes. A file that
// changed size while it was read fails the write (t should be a
// snapshot, which does not change). Contents beyond twice the blocks
// the archived files allocate (each file once) plus ArchiveSlack and
// EntrySlack per entry are ErrResourceExhausted (sparse files and hard
// links are written whole: such a tree is refused rather than blown up).
// ctx's cancellation stops it.
func WriteTar(ctx context.Context, w io.Writer, t *Tree, chs []Change) error {
	tw := tar.NewWriter(w)
	b := &budget{allowed: ArchiveSlack, seen: map[[2]uint64]bool{}}
	for _, c := range chs {
		b.allowed += EntrySlack
		if err := ctx.Err(); err != nil {
			return err
		}
		if c.Op == OpDeleted {
			h := &tar.Header{Name: c.Path, Typeflag: tar.TypeReg, Mode: 0o600, Format: tar.FormatPAX,
				PAXRecords: map[string]string{DeletedKey: "1"}}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		if err := writeEntry(tw, t, c.New, b); err != nil {
			return fmt.Errorf("archive %q: %w", "/"+c.Path, err)
		}
	}
	return tw.Close()
}

// budget is what WriteTar's contents may still grow to: allowed and
// written bytes, and the files (device, inode) whose blocks are counted.
type budget struct {
	allowed, written int64
	seen             map[[2]uint64]bool
}

// take counts file fi's contents, and its blocks unless counted already;
// ErrResourceExhausted when the contents go over the bound.
func (b *budget) take(path string, fi os.FileInfo) error {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		k := [2]uint64{uint64(st.Dev), st.Ino}
		if !b.seen[k] {
			b.seen[k] = true
			b.allowed += 2 * 512 * st.Blocks
		}
	}
	b.written += fi.Size()
	if b.written > b.allowed {
		return errdefs.Newf(errdefs.ErrResourceExhausted,
			"the archive's contents reach %d bytes at %q, far more than its files take on disk (sparse files or hard links)", b.written, "/"+path)
	}
	return nil
}

// writeEntry writes entry e of t (its header and contents) to tw,
// counting a file's contents against b.
func writeEntry(tw *tar.Writer, t *Tree, e *Entry, b *budget) error {
	h := &tar.Header{Name: e.Path, Mode: int64(e.Mode), Uid: int(e.UID), Gid: int(e.GID),
		ModTime: time.Unix(0, e.Mtime), Format: tar.FormatPAX}
	switch e.Kind {
	case KindDir:
		h.Typeflag = tar.TypeDir
		if h.Name == "" {
			h.Name = "."
		}
		return tw.WriteHeader(h)
	case KindSymlink:
		h.Typeflag, h.Linkname = tar.TypeSymlink, e.Target
		return tw.WriteHeader(h)
	case KindFile:
		f, err := t.Open(e.Path)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if err := b.take(e.Path, fi); err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		return err
	default:
		var st unix.Stat_t
		dir, name := split(e.Path)
		dfd, err := t.OpenDir(dir, true)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			h.Typeflag = tar.TypeChar
		case unix.S_IFBLK:
			h.Typeflag = tar.TypeBlock
		case unix.S_IFIFO:
			h.Typeflag = tar.TypeFifo
		default:
			return nil // a socket: nothing to carry
		}
		h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		return tw.WriteHeader(h)
	}
}

// ApplyOptions limit what ApplyTar makes.
type ApplyOptions struct {
	// PrivilegedBelow: a file owned by a host uid (gid) below it gets no
	// setuid (setgid) bit, whatever the archive says (a sandbox cannot
	// make such a file; storage.DefaultIDShift.UIDBase is the first id
	// sandboxes own files as). 0 keeps every bit.
	PrivilegedBelow uint32
}

// ApplyTar applies the change archive r (WriteTar's) to tree t, which
// should be a copy of the archive's base tree: each entry replaces what
// is at its path (a directory that stays a directory keeps its contents
// and takes the entry's mode and owner), each deleted path is removed
// with everything beneath it. Paths are resolved beneath t's root and
// through no symlink, whatever the archive holds; an entry whose name is
// not a clean relative path, of a type WriteTar does not write (a hard
// link), or a device (a block device, or a character device other than
// 0:0: no sandbox can make one) is ErrInvalidArgument and stops it. On
// error t is left partly changed: the caller discards it. ctx's
// cancellation stops it.
func ApplyTar(ctx context.Context, r io.Reader, t *Tree, opts ApplyOptions) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read change archive: %w", err)
		}
		name := h.Name
		if name == "." || name == "./" {
			name = ""
		}
		rel, err := CleanRel("change archive entry", name)
		if err != nil {
			return err
		}
		if opts.PrivilegedBelow > 0 {
			if h.Uid < int(opts.PrivilegedBelow) {
				h.Mode &^= 0o4000
			}
			if h.Gid < int(opts.PrivilegedBelow) {
				h.Mode &^= 0o2000
			}
		}
		if err := applyEntry(t, rel, h, tr); err != nil {
			return fmt.Errorf("apply %q: %w", "/"+rel, err)
		}
	}
}

// applyEntry applies header h (contents in r) at rel of t.
func applyEntry(t *Tree, rel string, h *tar.Header, r io.Reader) error {
	dir, name := split(rel)
	deleted := h.PAXRecords[DeletedKey] == "1"
	if rel == "" {
		if deleted || h.Typeflag != tar.TypeDir {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "the root can only be a directory")
		}
		dir, name = "", "."
	}
	dfd, err := t.OpenDir(dir, false)
	if deleted && (err == unix.ENOENT || err == unix.ENOTDIR) {
		return nil // gone with its parent already
	}
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if deleted {
		return removeTree(dfd, name)
	}
	var st unix.Stat_t
	exists := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	if h.Typeflag == tar.TypeDir && exists && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return setMeta(dfd, name, h, false)
	}
	if exists {
		if err := removeTree(dfd, name); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return err
		}
	case tar.TypeReg:
		fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), name)
		n, err := io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if n != h.Size {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "%d bytes of %d", n, h.Size)
		}
	case tar.TypeSymlink:
		if err := unix.Symlinkat(h.Linkname, dfd, name); err != nil {
			return err
		}
		return setMeta(dfd, name, h, true)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if h.Typeflag == tar.TypeBlock || h.Typeflag == tar.TypeChar && (h.Devmajor != 0 || h.Devminor != 0) {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "a device node (%d:%d) is not a snapshot's content", h.Devmajor, h.Devminor)
		}
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[h.Typeflag]
		dev := unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor))
		if err := unix.Mknodat(dfd, name, kind|0o600, int(dev)); err != nil {
			return err
		}
	default:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "entry type %q is not one a change archive holds", h.Typeflag)
	}
	return setMeta(dfd, name, h, false)
}

// setMeta gives name in dfd h's owner, then its mode (after the owner:
// chown clears setuid bits) and, unless it is a directory, its
// modification time. A symlink gets its owner and times only.
func setMeta(dfd int, name string, h *tar.Header, symlink bool) error {
	if err := unix.Fchownat(dfd, name, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if !symlink {
		if err := unix.Fchmodat(dfd, name, uint32(h.Mode)&0o7777, 0); err != nil {
			return err
		}
	}
	if h.Typeflag == tar.TypeDir {
		return nil
	}
	ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	return unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// removeTree removes name from dfd with everything beneath it, through
// no symlink; a missing name is not an error.
func removeTree(dfd int, name string) error {
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	// Read whole before removing: a directory read while it shrinks may
	// skip names.
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeTree(fd, n); err != nil {
			return err
		}
	}
	return unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
}
