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
	"github.com/forkbox/forkbox/storage"
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
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "btrfs: no /dev/loop-control (loop devices): %v", err)
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

// makeImage creates the file img of size bytes, with its blocks reserved
// on the host (storage.Preallocate), and formats it as btrfs. It works on a temporary name and renames at the end, so a crash
// never leaves a half-formatted image under the real name.
func makeImage(img string, size int64) error {
	tmp := img + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("btrfs: create image: %w", err)
	}
	err = storage.Preallocate(f, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("btrfs: image %s: %w", tmp, err)
	}
	// -K: no discard (it would punch the reserved blocks out); -q: quiet.
	out, err := exec.Command("mkfs.btrfs", "-q", "-K", "-L", "forkbox", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("btrfs: mkfs.btrfs %s: %v: %s: %w", tmp, err, strings.TrimSpace(string(out)), errdefs.ErrUnavailable)
	}
	if err := os.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("btrfs: %w", err)
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

// mountImage attaches img to a free loop device (auto-clearing, so the
// device goes away with the last unmount) and mounts it at dir.
func mountImage(img, dir string) error {
	loopFd, dev, err := attachLoop(img)
	if err != nil {
		return err
	}
	// With LO_FLAGS_AUTOCLEAR the device detaches when its last user goes:
	// once mounted that is the unmount; if the mount fails, this close.
	defer unix.Close(loopFd)
	// nodiscard: the image's blocks are reserved on the host and must stay so.
	if err := unix.Mount(dev, dir, "btrfs", mountFlags, "nodiscard"); err != nil {
		return fmt.Errorf("btrfs: mount %s (%s) at %s: %v: %w", img, dev, dir, err, errdefs.ErrUnavailable)
	}
	return nil
}

// attachLoop binds a free loop device to the file img and returns the
// open device and its path. It asks /dev/loop-control for a free device
// and retries when another process takes it first.
func attachLoop(img string) (int, string, error) {
	file, err := unix.Open(img, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("btrfs: open image %s: %w", img, err)
	}
	defer unix.Close(file)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("btrfs: open /dev/loop-control: %v: %w", err, errdefs.ErrUnavailable)
	}
	defer unix.Close(ctl)
	for attempt := 0; attempt < 16; attempt++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return -1, "", fmt.Errorf("btrfs: find a free loop device: %v: %w", err, errdefs.ErrUnavailable)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		fd, err := openLoopDevice(dev, n)
		if err != nil {
			return -1, "", err
		}
		// Direct I/O keeps the image's blocks out of the host's page cache
		// (btrfs caches them already); not every host filesystem allows it.
		cfg := unix.LoopConfig{Fd: uint32(file)}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], img)
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if errors.Is(err, unix.EINVAL) {
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(fd, &cfg)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			err = legacyLoopSetup(fd, file, &cfg.Info) // kernels before 5.8
		}
		if err == nil {
			return fd, dev, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) {
			return -1, "", fmt.Errorf("btrfs: attach %s to %s: %v: %w", img, dev, err, errdefs.ErrUnavailable)
		}
	}
	return -1, "", fmt.Errorf("btrfs: every free loop device was taken by others: %w", errdefs.ErrUnavailable)
}

// legacyLoopSetup binds file to the loop device fd with LOOP_SET_FD and
// then sets info (the auto-clear flag) with LOOP_SET_STATUS64.
func legacyLoopSetup(fd, file int, info *unix.LoopInfo64) error {
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_FD, file); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(fd, info); err != nil {
		_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// openLoopDevice opens loop device dev (number n), creating its device
// node when the host's /dev lacks it (block device 7:n).
func openLoopDevice(dev string, n int) (int, error) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("btrfs: create %s: %v: %w", dev, err, errdefs.ErrUnavailable)
		}
		fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("btrfs: open %s: %v: %w", dev, err, errdefs.ErrUnavailable)
	}
	return fd, nil
}
