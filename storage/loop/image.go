package loop

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Preallocate reserves size bytes of real disk for the open file f. A
// storage volume (a loop-mounted image) must never be short of the blocks
// it believes it has: a sparse image on a filling host disk gets write
// errors under the filesystem inside it, which then loses acknowledged
// data and turns read-only for every sandbox. With the space reserved, a
// full volume is an ordinary ENOSPC. ErrInsufficientStorage when the host
// has not that much free.
func Preallocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("reserve %d MiB for %s: the host's disk has not that much free: %w",
			size>>20, f.Name(), errdefs.ErrInsufficientStorage)
	}
	if err != nil {
		return fmt.Errorf("reserve %d MiB for %s: %w", size>>20, f.Name(), err)
	}
	return nil
}

// CreateImage makes the disk image path: a new file (mode 0600) of size
// bytes with its blocks reserved (Preallocate), handed to format (which
// writes a filesystem into it, mkfs) under the temporary name path+".tmp"
// and renamed to path once format succeeded. So a crash leaves no image
// or a formatted one, never a half-made one under the real name; on
// error nothing is left. A stale temporary file from an earlier crash is
// replaced. Errors are Preallocate's, format's as it returns them, and
// the file system's.
func CreateImage(path string, size int64, format func(tmp string) error) error {
	tmp := path + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	err = Preallocate(f, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = format(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// Mount attaches the image file img to a loop device (Attach with o) and
// mounts the filesystem on it at dir as fstype with flags (MS_*) and data
// (the filesystem's options). It returns the device's path. With
// autoclear the device detaches itself at the unmount; on error nothing
// stays attached or mounted. A mount error wraps the mount's errno (EINVAL
// for an option the kernel does not know), an attach error is Attach's.
func Mount(img, dir, fstype string, flags uintptr, data string, o Options) (string, error) {
	d, err := Attach(img, o)
	if err != nil {
		return "", err
	}
	defer d.Close() // the mount, once made, keeps the device bound
	if err := unix.Mount(d.Path(), dir, fstype, flags, data); err != nil {
		return "", fmt.Errorf("mount %s (%s on %s, %q) at %s: %w", img, fstype, d.Path(), data, dir, err)
	}
	return d.Path(), nil
}
