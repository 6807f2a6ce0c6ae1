package image

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/storage"
)

// This file holds the file-descriptor-relative primitives the extractor is
// built from. None of them takes a host path: every path is relative to a
// directory fd inside the rootfs, multi-component paths are resolved only by
// resolveIn (openat2 with RESOLVE_IN_ROOT), and single final components are
// operated on with calls that never follow a final symlink.

// resolveIn opens rel, a cleaned relative path ("" or "." for the root
// itself), inside the tree rooted at the directory fd root, with the open
// flags flags (O_CLOEXEC is added). Symlinks and ".." are resolved as if root
// were "/" (RESOLVE_IN_ROOT), magic links are refused. It returns a new fd
// the caller closes. EAGAIN/EINTR from concurrent renames are retried.
func resolveIn(root int, rel string, flags uint64) (int, error) {
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for try := 0; ; try++ {
		fd, err := unix.Openat2(root, rel, &how)
		if (err == unix.EAGAIN || err == unix.EINTR) && try < 16 {
			continue
		}
		return fd, err
	}
}

// splitRel splits a cleaned relative path into its parent ("" for the root)
// and final component.
func splitRel(rel string) (dir, base string) {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i], rel[i+1:]
	}
	return "", rel
}

// joinRel joins a cleaned relative directory ("" for the root) and a name.
func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// lstatAt stats name in the directory fd dir without following a final
// symlink. ok is false (and err nil) when name does not exist.
func lstatAt(dir int, name string) (st unix.Stat_t, ok bool, err error) {
	err = unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		return st, false, nil
	}
	return st, err == nil, err
}

// isDir reports whether st describes a directory.
func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

// removeAll removes name from the directory fd dir, recursively when it is a
// directory. It never follows symlinks: each directory is opened with
// O_NOFOLLOW relative to its parent's fd and every removal is an unlinkat.
// A missing name is not an error.
func removeAll(dir int, name string) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := storage.ReadDirNames(fd)
	for _, n := range names {
		if err != nil {
			break
		}
		err = removeAll(fd, n)
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dir, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return err
	}
	return nil
}

// toTimespec converts t for utimensat; times before 1970 (and the zero time)
// become the epoch.
func toTimespec(t time.Time) unix.Timespec {
	if t.IsZero() || t.Unix() < 0 {
		return unix.Timespec{}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// setTimes sets the access and modification time of name in the directory fd
// dir to t without following a final symlink.
func setTimes(dir int, name string, t time.Time) error {
	ts := toTimespec(t)
	return unix.UtimesNanoAt(dir, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// fixDir sets owner uid/gid and permission bits mode (0o7777 at most) of the
// directory name in the directory fd dir. The directory is opened with
// O_NOFOLLOW|O_DIRECTORY, so a symlink or non-directory is an error rather
// than followed.
func fixDir(dir int, name string, uid, gid int, mode uint32) error {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return err
	}
	return unix.Fchmod(fd, mode)
}

// inodeKey identifies a directory in the rootfs.
type inodeKey struct{ dev, ino uint64 }

// statKey returns the inodeKey of the file open at fd (O_PATH is enough).
func statKey(fd int) (inodeKey, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return inodeKey{}, err
	}
	return inodeKey{uint64(st.Dev), uint64(st.Ino)}, nil
}

// mkdirAt creates the directory name (mode 0700, until fixDir) in the
// directory fd pfd and records its depth below the rootfs. Nesting deeper
// than maxDepth levels is an errdefs.ErrInvalidArgument error: it bounds the
// fds held by the recursive removals, whatever symlinks the image uses to
// reach a directory. An existing name is unix.EEXIST.
func (x *extractor) mkdirAt(pfd int, name string) error {
	pk, err := statKey(pfd)
	if err != nil {
		return err
	}
	d, ok := x.depth[pk]
	if !ok {
		return fmt.Errorf("depth of the parent of %q unknown", name)
	}
	if d >= maxDepth {
		return invalidf("directories nested deeper than %d levels", maxDepth)
	}
	if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	k, err := statKey(fd)
	if err != nil {
		return err
	}
	x.depth[k] = d + 1
	return nil
}

// openParent returns an O_PATH fd (closed by the caller) for the directory
// rel inside the rootfs, resolved with resolveIn. When create is true,
// missing components are created one by one as directories with mode 0755
// owned by the mapped root and recorded as written in the current layer; a
// component that exists but does not resolve to a directory (a file or a
// dangling symlink) is an error.
func (x *extractor) openParent(rel string, create bool) (int, error) {
	const flags = unix.O_PATH | unix.O_DIRECTORY
	fd, err := resolveIn(x.root, rel, flags)
	if err == nil || !create || err != unix.ENOENT {
		return fd, err
	}
	pfd, err := resolveIn(x.root, "", flags)
	if err != nil {
		return -1, err
	}
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		sub := strings.Join(comps[:i+1], "/")
		fd, err := resolveIn(x.root, sub, flags)
		if err == unix.ENOENT {
			if err = x.mkdirAt(pfd, c); err == unix.EEXIST {
				err = fmt.Errorf("path component %q exists but does not lead to a directory: %w", sub, unix.ENOTDIR)
			}
			if err == nil {
				err = fixDir(pfd, c, int(x.shift.UIDBase), int(x.shift.GIDBase), 0o755)
			}
			if err == nil {
				x.markTouched(sub)
				fd, err = resolveIn(x.root, sub, flags)
			}
		}
		unix.Close(pfd)
		if err != nil {
			return -1, err
		}
		pfd = fd
	}
	return pfd, nil
}

// prepare clears the way for a new entry name in the directory fd dir: a
// missing name needs nothing; an existing directory is kept when keepDir is
// true (existed is then true); anything else is removed (recursively, see
// removeAll) because a later layer overrides an earlier one.
func prepare(dir int, name string, keepDir bool) (existed bool, err error) {
	st, ok, err := lstatAt(dir, name)
	if err != nil || !ok {
		return false, err
	}
	if keepDir && isDir(&st) {
		return true, nil
	}
	return false, removeAll(dir, name)
}
