package btrfs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage/loop"
	"golang.org/x/sys/unix"
)

// Supported reports whether btrfs can be used on this host: the kernel
// knows the btrfs filesystem (built in or as a loaded module), mkfs.btrfs
// is installed, and loop devices can be set up. The error, wrapping
// errdefs.ErrUnavailable, says what is missing.
func Supported() error {
	switch runtime.GOARCH {
	case "amd64", "arm64", "riscv64", "loong64", "386", "arm", "s390x":
	default: // ioc encodes request numbers the generic way only
		return errdefs.Newf(errdefs.ErrUnavailable, "btrfs: ioctl numbers not known on %s", runtime.GOARCH)
	}
	if !kernelHasBtrfs() {
		return errdefs.Newf(errdefs.ErrUnavailable, "btrfs: the kernel has no btrfs filesystem (not in /proc/filesystems; try modprobe btrfs)")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "btrfs: mkfs.btrfs not found (install btrfs-progs)")
	}
	if err := loop.Supported(); err != nil {
		return fmt.Errorf("btrfs: %w", err)
	}
	return nil
}

// kernelHasBtrfs reports whether /proc/filesystems lists btrfs.
func kernelHasBtrfs() bool {
	f, err := os.Open("/proc/filesystems")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 && fields[len(fields)-1] == "btrfs" {
			return true
		}
	}
	return false
}

// isBtrfs reports whether path is on a btrfs filesystem.
func isBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return st.Type == unix.BTRFS_SUPER_MAGIC, nil
}

// ensureFilesystem makes dir a directory on btrfs. When dir (or, while it
// does not exist, its parent) is on btrfs already, it is used as it is.
// Otherwise the image file dir+".img" (created with size bytes reserved and
// formatted with mkfs.btrfs when missing) is mounted at dir through a loop
// device. It returns whether it mounted something.
func ensureFilesystem(dir string, size int64) (mounted bool, err error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return false, fmt.Errorf("btrfs: create %s: %w", dir, err)
	}
	if ok, err := isBtrfs(dir); err != nil {
		return false, fmt.Errorf("btrfs: statfs %s: %w", dir, err)
	} else if ok {
		return false, nil
	}
	img := dir + ".img"
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		if err := makeImage(img, size); err != nil {
			return false, err
		}
	} else if err != nil {
		return false, fmt.Errorf("btrfs: image %s: %w", img, err)
	}
	if err := mountImage(img, dir); err != nil {
		return false, err
	}
	return true, nil
}

// makeImage creates the image file img of size bytes, with its blocks
// reserved on the host, formatted as btrfs (loop.CreateImage: a crash
// never leaves a half-formatted image under the real name).
func makeImage(img string, size int64) error {
	err := loop.CreateImage(img, size, func(tmp string) error {
		// -K: no discard (it would punch the reserved blocks out); -q: quiet.
		out, err := exec.Command("mkfs.btrfs", "-q", "-K", "-L", "forkbox", tmp).CombinedOutput()
		if err != nil {
			return fmt.Errorf("mkfs.btrfs %s: %v: %s: %w", tmp, err, strings.TrimSpace(string(out)), errdefs.ErrUnavailable)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("btrfs: image %s: %w", img, err)
	}
	return nil
}

// Unmount unmounts the filesystem New mounted at dir (the loop device
// detaches itself), for tests and uninstalling; the image file stays. It
// fails with ErrConflict while something uses the filesystem (a running
// sandbox), and does nothing when dir is not a mount point of its own.
func Unmount(dir string) error {
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(dir+"/..", &parent) != nil || st.Dev == parent.Dev {
		return nil
	}
	if err := unix.Unmount(dir, 0); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("btrfs: unmount %s: %w: %w", dir, err, errdefs.ErrConflict)
		}
		return fmt.Errorf("btrfs: unmount %s: %w: %w", dir, err, errdefs.ErrInternal)
	}
	return nil
}

// mountFlags are the flags of the filesystem New mounts: no device
// files or setuid programs take effect from sandbox data, and reads do not
// write access times (an atime update on a file shared with a snapshot
// would copy metadata and count against the layer's limit).
const mountFlags = unix.MS_NODEV | unix.MS_NOSUID | unix.MS_NOATIME

// mountImage mounts the btrfs image img at dir through a loop device
// (direct I/O where the host's filesystem allows it: btrfs caches the
// image's blocks already; autoclear, so the device goes with the unmount).
func mountImage(img, dir string) error {
	// nodiscard: the image's blocks are reserved on the host and must stay so.
	if _, err := loop.Mount(img, dir, "btrfs", mountFlags, "nodiscard", loop.Options{DirectIO: true}); err != nil {
		return fmt.Errorf("btrfs: %v: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}
