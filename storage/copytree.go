package storage

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CopyTree copies the directory tree src into the existing directory dst
// (a fresh btrfs subvolume, a template's new root filesystem), preserving owners, permission bits (setuid and
// friends included), modification times, symlinks, FIFOs and hard links
// within the tree. Device nodes and sockets are skipped and extended
// attributes are not copied. Symlinks are never followed. The root of dst
// gets the owner, mode and times of src's root. Cancelling ctx stops the
// copy with ctx's error. It returns the bytes of the regular files it
// copied (hard links counted once). Errors name src.
func CopyTree(ctx context.Context, src, dst string) (int64, error) {
	var size int64
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	var dirs []string // in walk order; attributes are applied in reverse
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if rel != "." {
				if err := unix.Mkdir(target, 0o700); err != nil {
					return err
				}
			}
			dirs = append(dirs, rel)
			return nil
		case unix.S_IFREG:
			if st.Nlink > 1 {
				key := inode{st.Dev, st.Ino}
				if first, ok := links[key]; ok {
					return os.Link(first, target)
				}
				links[key] = target
			}
			if err := copyFile(p, target); err != nil {
				return err
			}
			size += st.Size
		case unix.S_IFLNK:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case unix.S_IFIFO:
			if err := unix.Mkfifo(target, 0o600); err != nil {
				return err
			}
		default: // device nodes, sockets
			return nil
		}
		return copyAttrs(target, &st)
	})
	if err != nil {
		return 0, fmt.Errorf("copy %s: %w", src, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(src, dirs[i]), &st); err != nil {
			return 0, fmt.Errorf("copy %s: %w", src, err)
		}
		if err := copyAttrs(filepath.Join(dst, dirs[i]), &st); err != nil {
			return 0, fmt.Errorf("copy %s: %w", src, err)
		}
	}
	return size, nil
}

// copyFile copies the contents of regular file src into the new file dst
// (created 0600; copyAttrs sets the real mode). io.Copy between files uses
// copy_file_range, which shares extents when both are on one btrfs.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyAttrs gives path (not followed if a symlink) the owner, permission
// bits and access/modification times in st. The mode is set after the
// owner because chown clears setuid and setgid bits.
func copyAttrs(path string, st *unix.Stat_t) error {
	if err := unix.Lchown(path, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(path, st.Mode&0o7777); err != nil {
			return err
		}
	}
	times := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, path, times, unix.AT_SYMLINK_NOFOLLOW)
}
