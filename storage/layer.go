package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Layer is a sandbox's writable layer: an overlay of an upper directory on
// a template's read-only rootfs, mounted at Merged. All of a sandbox's
// writes land in Upper; removing the layer removes them.
type Layer struct {
	// Dir holds upper/, work/ and rootfs/ (the mount point).
	Dir string
}

// Upper is the directory holding the sandbox's changes.
func (l Layer) Upper() string { return filepath.Join(l.Dir, "upper") }

// Merged is where the overlay is mounted: the sandbox's root filesystem.
func (l Layer) Merged() string { return filepath.Join(l.Dir, "rootfs") }

func (l Layer) work() string { return filepath.Join(l.Dir, "work") }

// CreateLayer makes a writable layer in dir (created if missing) over the
// read-only lower rootfs and mounts it (nodev, nosuid). The upper root
// directory is owned by the sandbox's root (shifted). On error nothing stays
// mounted.
func CreateLayer(dir, lower string, shift IDShift) (Layer, error) {
	l := Layer{Dir: dir}
	for _, d := range []string{l.Upper(), l.work(), l.Merged()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return l, err
		}
	}
	if err := os.Lchown(l.Upper(), shift.UID(RootUID), shift.GID(RootUID)); err != nil {
		return l, err
	}
	for _, p := range []string{lower, l.Upper(), l.work()} {
		if strings.ContainsAny(p, ",:") {
			return l, fmt.Errorf("overlay path %q contains ',' or ':'", p)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, l.Upper(), l.work())
	if err := unix.Mount("overlay", l.Merged(), "overlay", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return l, fmt.Errorf("mount overlay at %s: %w", l.Merged(), err)
	}
	return l, nil
}

// RemoveLayer unmounts the layer (if mounted) and deletes dir entirely
// (with RemoveTree: the upper directory holds whatever the sandbox made,
// including trees deeper than any open-files limit). Removing a layer that
// is already gone is not an error.
func RemoveLayer(dir string) error {
	l := Layer{Dir: dir}
	if err := unix.Unmount(l.Merged(), unix.MNT_DETACH); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", l.Merged(), err)
	}
	if err := RemoveTree(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// IsMounted reports whether the layer's overlay is mounted.
func (l Layer) IsMounted() bool {
	var st, parent unix.Stat_t
	if unix.Lstat(l.Merged(), &st) != nil || unix.Lstat(l.Dir, &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// DiskUsage returns the bytes the layer's changes occupy (allocated blocks
// of everything under Upper), without following symlinks.
func (l Layer) DiskUsage() (int64, error) {
	var total int64
	err := filepath.WalkDir(l.Upper(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	return total, err
}
