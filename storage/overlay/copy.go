package overlay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// copier copies an overlay upper directory into a snapshot layer with
// everything overlayfs needs to show the same view when the copy is a
// lower layer: regular files (reflinked when the filesystem can, else
// copied sparsely), directories, symlinks, device nodes (whiteouts are
// 0/0 character devices), fifos and sockets, owners, modes, access and
// modification times, and extended attributes (trusted.overlay.opaque
// and the other overlay attributes that describe the view; see
// skipXattr). Hard links become separate copies. It works with
// descriptor-relative calls and never follows a symlink, so whatever the
// sandbox left in its upper directory, nothing outside is read or
// written.
type copier struct {
	ctx context.Context
	// noReflink forces byte copies (to measure them, and in tests).
	noReflink bool
	// maxEntries > 0 stops the copy with ErrResourceExhausted once the
	// tree holds more entries than that (the sandbox is frozen while it
	// is copied); entries counts them, the root included.
	maxEntries, entries int64
	// depth is the nesting of the directory being copied; past
	// storage.MaxManifestDepth the copy stops (two descriptors a level).
	depth int
	// Reflinked and Copied count regular files cloned and copied by
	// bytes; Bytes sums the allocated bytes (st_blocks × 512) of
	// everything made.
	Reflinked, Copied, Bytes int64
	buf                      []byte
}

// skipXattr reports whether the extended attribute name is left out of a
// copy: overlay attributes that tie an upper directory to the layers it
// was mounted on (origin file handles, impure and nlink bookkeeping, the
// upper's uuid) rather than describe its view. They would be wrong, or
// at best unused, in a lower layer of another stack.
func skipXattr(name string) bool {
	switch name {
	case "trusted.overlay.origin", "trusted.overlay.impure", "trusted.overlay.nlink",
		"trusted.overlay.uuid", "trusted.overlay.upper":
		return true
	}
	return false
}

// copyTree copies the directory src to dst, which must not exist.
func (c *copier) copyTree(src, dst string) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	if err := unix.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dst, err)
	}
	defer unix.Close(dfd)
	if err := c.count(); err != nil {
		return err
	}
	if err := c.copyDir(sfd, dfd, src); err != nil {
		return err
	}
	// The root's attributes, through its parent's path.
	return c.finish(unix.AT_FDCWD, unix.AT_FDCWD, src, dst, &st)
}

// copyDir copies the entries of the open directory sfd into dfd; where
// is sfd's path, for errors.
func (c *copier) copyDir(sfd, dfd int, where string) error {
	names, err := readAllNames(sfd)
	if err != nil {
		return fmt.Errorf("read %s: %w", where, err)
	}
	for _, name := range names {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if err := c.copyEntry(sfd, dfd, name, where+"/"+name); err != nil {
			return err
		}
	}
	return nil
}

// count counts one more entry and fails once there are more than
// maxEntries.
func (c *copier) count() error {
	c.entries++
	if c.maxEntries > 0 && c.entries > c.maxEntries {
		return errdefs.Newf(errdefs.ErrResourceExhausted,
			"the files hold more than %d entries (files, directories, links), the most a snapshot may hold; remove some and snapshot again", c.maxEntries)
	}
	return nil
}

// copyEntry copies sfd's entry name into dfd; where is its path.
func (c *copier) copyEntry(sfd, dfd int, name, where string) error {
	if err := c.count(); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s: %w", where, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return fmt.Errorf("copy %s: %w", where, err)
		}
		s, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", where, err)
		}
		defer unix.Close(s)
		d, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open copy of %s: %w", where, err)
		}
		defer unix.Close(d)
		if c.depth++; c.depth > storage.MaxManifestDepth {
			return errdefs.Newf(errdefs.ErrResourceExhausted, "directories nested deeper than %d levels", storage.MaxManifestDepth)
		}
		err = c.copyDir(s, d, where)
		c.depth--
		if err != nil {
			return err
		}
	case unix.S_IFREG:
		if err := c.copyFile(sfd, dfd, name, where, st.Size); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := readlinkat(sfd, name)
		if err != nil {
			return fmt.Errorf("readlink %s: %w", where, err)
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return fmt.Errorf("copy %s: %w", where, err)
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		// Character device 0/0 is an overlay whiteout.
		if err := unix.Mknodat(dfd, name, st.Mode&unix.S_IFMT|0o600, int(st.Rdev)); err != nil {
			return fmt.Errorf("copy %s: %w", where, err)
		}
	default:
		return fmt.Errorf("copy %s: unknown file type %#o", where, st.Mode&unix.S_IFMT)
	}
	return c.finish(sfd, dfd, name, name, &st)
}

// copyFile copies the regular file sfd/name (size bytes) to dfd/name.
func (c *copier) copyFile(sfd, dfd int, name, where string, size int64) error {
	s, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", where, err)
	}
	defer unix.Close(s)
	d, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("copy %s: %w", where, err)
	}
	defer unix.Close(d)
	if !c.noReflink {
		err := unix.IoctlFileClone(d, s)
		if err == nil {
			c.Reflinked++
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EXDEV) &&
			!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
			return fmt.Errorf("reflink %s: %w", where, err)
		}
	}
	if err := c.copyBytes(s, d, size); err != nil {
		return fmt.Errorf("copy %s: %w", where, err)
	}
	c.Copied++
	return nil
}

// copyBytes copies size bytes from s to d with reads and writes, only the
// data regions (holes stay holes, so a huge sparse file costs no space).
func (c *copier) copyBytes(s, d int, size int64) error {
	if c.buf == nil {
		c.buf = make([]byte, 1<<20)
	}
	for off := int64(0); off < size; {
		start, err := unix.Seek(s, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		end := size
		if err != nil {
			start = off // no SEEK_DATA here: copy everything
		} else if e, err := unix.Seek(s, start, unix.SEEK_HOLE); err == nil && e < size {
			end = e
		}
		for start < end {
			if err := c.ctx.Err(); err != nil {
				return err
			}
			n, err := unix.Pread(s, c.buf[:min(int64(len(c.buf)), end-start)], start)
			if err != nil {
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			if _, err := unix.Pwrite(d, c.buf[:n], start); err != nil {
				return err
			}
			start += int64(n)
		}
		off = end
	}
	return unix.Ftruncate(d, size)
}

// finish gives the copy dname in dfd the owner, mode, extended attributes
// and times of sname in sfd (described by st), in the order that keeps
// them: owner first (chown clears set-id bits and file capabilities),
// then mode and attributes, times last.
func (c *copier) finish(sfd, dfd int, sname, dname string, st *unix.Stat_t) error {
	if err := unix.Fchownat(dfd, dname, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown copy of %s: %w", sname, err)
	}
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	if !isLink {
		if err := unix.Fchmodat(dfd, dname, st.Mode&0o7777, 0); err != nil {
			return fmt.Errorf("chmod copy of %s: %w", sname, err)
		}
	}
	if err := copyXattrs(fdPath(sfd, sname), fdPath(dfd, dname)); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	if err := unix.UtimesNanoAt(dfd, dname, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of copy of %s: %w", sname, err)
	}
	var dst unix.Stat_t
	if err := unix.Fstatat(dfd, dname, &dst, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		c.Bytes += dst.Blocks * 512
	}
	return nil
}

// copyXattrs copies the extended attributes of src to dst (paths; the
// last component is not followed), except those skipXattr leaves out.
func copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		if skipXattr(name) {
			continue
		}
		val, err := getXattr(src, name)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", name, dst, err)
		}
	}
	return nil
}

// listXattrs returns the extended attribute names of path (not followed).
func listXattrs(path string) ([]string, error) {
	for size := 1024; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		return names, nil
	}
}

// getXattr returns the value of extended attribute name of path.
func getXattr(path, name string) ([]byte, error) {
	for size := 256; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get xattr %s of %s: %w", name, path, err)
		}
		return buf[:n], nil
	}
}

// fdPath names entry name of open directory dirfd as a path the kernel
// resolves without following the last component ("/proc/self/fd/N/name"),
// or name itself for AT_FDCWD.
func fdPath(dirfd int, name string) string {
	if dirfd == unix.AT_FDCWD {
		return name
	}
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
}

// readlinkat returns the target of symlink name in dirfd.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// readAllNames returns every entry name of the open directory fd except
// "." and "..", read through a fresh open file description.
func readAllNames(fd int) ([]string, error) {
	d, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(d), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}
