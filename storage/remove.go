package storage

import (
	"errors"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// removeBatch is how many directory entries RemoveTree reads at a time.
const removeBatch = 1024

// RemoveTree deletes path and everything under it without following
// symlinks, like os.RemoveAll, but with a bounded number of open
// descriptors however deep the tree is. os.RemoveAll holds one descriptor
// per directory level, so a sandbox that nests directories deeper than the
// daemon's open-files limit (trivial from inside: mkdir d; cd d; repeat)
// would make every removal of its writable layer fail with EMFILE and starve
// the daemon of descriptors on each retry.
//
// It works on the directory level by level instead: entries of path are
// removed directly when possible; a non-empty subdirectory has its entries
// renamed up into path (under fresh names) and is then removed, so the tree
// gets flatter instead of deeper. Every entry is renamed at most once. It
// never crosses into another mounted filesystem. A missing path is not an
// error.
func RemoveTree(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return ignoreNotExist(os.Remove(path))
	}
	top, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return ignoreNotExist(&os.PathError{Op: "open", Path: path, Err: err})
	}
	defer unix.Close(top)
	var st unix.Stat_t
	if err := unix.Fstat(top, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	r := &treeRemover{path: path, top: top, dev: st.Dev}
	for {
		names, err := readNames(top)
		if err != nil {
			return &os.PathError{Op: "readdir", Path: path, Err: err}
		}
		if len(names) == 0 {
			break
		}
		for _, name := range names {
			if err := r.remove(name); err != nil {
				return err
			}
		}
	}
	return ignoreNotExist(os.Remove(path))
}

// treeRemover removes the entries of one open directory (top).
type treeRemover struct {
	path string // top's path, for errors
	top  int
	dev  uint64 // top's device: the tree never leaves it
	seq  int    // counter for the names of entries moved up
}

// remove deletes top's entry name: a file or an empty directory at once; a
// non-empty directory's entries are moved up into top first.
func (r *treeRemover) remove(name string) error {
	err := unix.Unlinkat(r.top, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return r.err("unlink", name, err)
	}
	err = unix.Unlinkat(r.top, name, unix.AT_REMOVEDIR)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return r.err("rmdir", name, err)
	}
	dir, err := unix.Openat(r.top, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return r.err("open", name, err)
	}
	defer unix.Close(dir)
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil {
		return r.err("fstat", name, err)
	}
	if st.Dev != r.dev {
		return r.err("remove", name, errors.New("is on another filesystem (a mount point)"))
	}
	for {
		names, err := readNames(dir)
		if err != nil {
			return r.err("readdir", name, err)
		}
		if len(names) == 0 {
			break
		}
		for _, child := range names {
			if err := r.moveUp(dir, child); err != nil {
				return r.err("move up from", name, err)
			}
		}
	}
	if err := unix.Unlinkat(r.top, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return r.err("rmdir", name, err)
	}
	return nil
}

// moveUp renames dir's entry child into top under a name not in use there.
func (r *treeRemover) moveUp(dir int, child string) error {
	for {
		r.seq++
		to := ".forkbox-rm-" + strconv.Itoa(r.seq)
		err := unix.Renameat2(dir, child, r.top, to, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			// No RENAME_NOREPLACE on this filesystem: make sure the name
			// is free, then rename plainly (nothing else writes here).
			var st unix.Stat_t
			if unix.Fstatat(r.top, to, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				continue
			}
			err = unix.Renameat(dir, child, r.top, to)
		}
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
}

func (r *treeRemover) err(op, name string, err error) error {
	return &os.PathError{Op: op, Path: r.path + "/" + name, Err: err}
}

// readNames returns up to removeBatch names from the start of the open
// directory fd (reading through a fresh open file description, so entries
// removed or added since the last call do not make it skip any). It does
// not return "." and "..".
func readNames(fd int) ([]string, error) {
	d, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(d), ".")
	defer f.Close()
	names, err := f.Readdirnames(removeBatch)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return names, err
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// ReadDirNames returns the names in the directory open for reading as fd,
// from its start (it seeks there first), without "." and "..", unsorted.
func ReadDirNames(fd int) ([]string, error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, err
	}
	buf := make([]byte, 32<<10)
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
