// Package loop attaches files to loop block devices and makes the disk
// images the storage drivers mount through them (a btrfs or XFS volume, an
// ext4 disk per layer). It is the only code in forkbox that speaks the
// loop driver's ioctls (linux/loop.h).
//
// Every device it attaches has autoclear set: the kernel detaches it once
// the last user is gone, so a mounted image needs no bookkeeping (the
// unmount detaches it) and a crash between attach and mount leaks
// nothing (closing the last descriptor detaches it). Attach uses
// LOOP_CONFIGURE (one ioctl, Linux 5.8) and falls back to LOOP_SET_FD and
// LOOP_SET_STATUS64 on older kernels.
//
// The functions are safe for concurrent use: two callers racing for the
// same free device retry with another.
package loop

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// controlPath is the loop driver's control device, which hands out free
// device numbers.
const controlPath = "/dev/loop-control"

// attachTries bounds how often Attach takes another free device after
// another process bound the one it was given first.
const attachTries = 16

// Options say how Attach sets up a device.
type Options struct {
	// DirectIO asks for direct I/O on the backing file, so its blocks do
	// not sit in the host's page cache a second time beside the cache of
	// the filesystem on the device. A backing filesystem that refuses
	// direct I/O (tmpfs, or a device block size it cannot serve) gets
	// buffered I/O instead: it is a preference, never an error.
	DirectIO bool
}

// Device is a loop device Attach bound to a file, held open. The caller
// mounts it (or otherwise opens it) and then calls Close: with autoclear
// the device stays bound while the mount holds it and detaches with the
// unmount. A Device is not safe for concurrent use.
type Device struct {
	path string
	fd   int
}

// Path returns the device's node, /dev/loopN.
func (d *Device) Path() string { return d.path }

// Close releases the descriptor Attach held. When nothing else holds the
// device (no mount), autoclear detaches it from its file now. Closing
// twice is not an error.
func (d *Device) Close() error {
	if d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	if err != nil {
		return fmt.Errorf("close %s: %w", d.path, err)
	}
	return nil
}

// setupFunc binds the open file to the open loop device dev with the
// given flags (LO_FLAGS_*). It returns EBUSY when another process bound
// the device first.
type setupFunc func(dev, file int, name string, flags uint32) error

// Attach binds the file at path (opened read-write) to a free loop device
// with autoclear, and direct I/O when o asks for it and the backing
// filesystem allows it. It returns the held device; see Device for what
// the caller does next. Errors: the file's open error as it is (ENOENT
// for a missing file), and ErrUnavailable when the host has no usable
// loop devices or every free one was taken by others attachTries times.
func Attach(path string, o Options) (*Device, error) {
	return attach(path, o, configure)
}

// attach is Attach with the ioctl sequence setup chooses (tests force
// the fallback with legacySetup).
func attach(path string, o Options, setup setupFunc) (*Device, error) {
	file, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(file)
	ctl, err := unix.Open(controlPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %v: %w", controlPath, err, errdefs.ErrUnavailable)
	}
	defer unix.Close(ctl)
	flags := uint32(unix.LO_FLAGS_AUTOCLEAR)
	if o.DirectIO {
		flags |= unix.LO_FLAGS_DIRECT_IO
	}
	for range attachTries {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %v: %w", err, errdefs.ErrUnavailable)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := openDevice(dev, n)
		if err != nil {
			return nil, err
		}
		err = setup(fd, file, path, flags)
		if err == nil {
			return &Device{path: dev, fd: fd}, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("attach %s to %s: %v: %w", path, dev, err, errdefs.ErrUnavailable)
		}
		// Another process bound the device between GET_FREE and here.
	}
	return nil, fmt.Errorf("attach %s: every free loop device was taken by others %d times: %w",
		path, attachTries, errdefs.ErrUnavailable)
}

// configure binds file to dev with LOOP_CONFIGURE. A kernel that refuses
// direct I/O for this file answers EINVAL, and the device is configured
// again without it; a kernel without LOOP_CONFIGURE (before 5.8: ENOTTY,
// or EINVAL from some) gets legacySetup.
func configure(dev, file int, name string, flags uint32) error {
	cfg := unix.LoopConfig{Fd: uint32(file)}
	cfg.Info.Flags = flags
	setName(&cfg.Info, name)
	err := unix.IoctlLoopConfigure(dev, &cfg)
	if errors.Is(err, unix.EINVAL) && flags&unix.LO_FLAGS_DIRECT_IO != 0 {
		cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(dev, &cfg)
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
		return legacySetup(dev, file, name, flags)
	}
	return err
}

// legacySetup binds file to dev the way kernels before LOOP_CONFIGURE
// do: LOOP_SET_FD, then LOOP_SET_STATUS64 for the flags and name, then
// LOOP_SET_DIRECT_IO when asked (refused: buffered I/O stays). A failure
// after LOOP_SET_FD unbinds the device again.
func legacySetup(dev, file int, name string, flags uint32) error {
	if err := unix.IoctlSetInt(dev, unix.LOOP_SET_FD, file); err != nil {
		return err
	}
	var info unix.LoopInfo64
	info.Flags = flags &^ unix.LO_FLAGS_DIRECT_IO // not a status flag
	setName(&info, name)
	if err := unix.IoctlLoopSetStatus64(dev, &info); err != nil {
		_ = unix.IoctlSetInt(dev, unix.LOOP_CLR_FD, 0)
		return err
	}
	if flags&unix.LO_FLAGS_DIRECT_IO != 0 {
		_ = unix.IoctlSetInt(dev, unix.LOOP_SET_DIRECT_IO, 1)
	}
	return nil
}

// setName records name (cut to the field's 63 bytes) as the device's
// file name, which LOOP_GET_STATUS64 reports; the kernel keeps the full
// path of the backing file in sysfs either way.
func setName(info *unix.LoopInfo64, name string) {
	copy(info.File_name[:len(info.File_name)-1], name)
}

// openDevice opens loop device dev (number n) read-write, making its
// node (block device 7:n) when the host's /dev lacks it (some container
// hosts have no devtmpfs).
func openDevice(dev string, n int) (int, error) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("create %s: %v: %w", dev, err, errdefs.ErrUnavailable)
		}
		fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("open %s: %v: %w", dev, err, errdefs.ErrUnavailable)
	}
	return fd, nil
}

// Supported returns nil when this host has loop devices (the control
// device exists), or an error wrapping ErrUnavailable saying why not.
func Supported() error {
	if _, err := os.Stat(controlPath); err != nil {
		return fmt.Errorf("no loop devices (%s: %v): %w", controlPath, err, errdefs.ErrUnavailable)
	}
	return nil
}
