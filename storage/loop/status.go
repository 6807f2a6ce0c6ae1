package loop

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Status is what the kernel reports of a bound loop device
// (LOOP_GET_STATUS64).
type Status struct {
	// BackingDev and BackingInode identify the backing file: the device
	// number of its filesystem and its inode number.
	BackingDev, BackingInode uint64
	// Flags are the device's LO_FLAGS_* (autoclear, direct I/O, read-only).
	Flags uint32
}

// Autoclear reports whether the device detaches itself when its last
// user goes.
func (s Status) Autoclear() bool { return s.Flags&unix.LO_FLAGS_AUTOCLEAR != 0 }

// DirectIO reports whether the device reads and writes its backing file
// with direct I/O.
func (s Status) DirectIO() bool { return s.Flags&unix.LO_FLAGS_DIRECT_IO != 0 }

// GetStatus returns the status of the loop device dev (/dev/loopN).
// ENXIO (wrapped) when the device is bound to no file.
func GetStatus(dev string) (Status, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Status{}, fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return Status{}, fmt.Errorf("status of %s: %w", dev, err)
	}
	return Status{BackingDev: info.Device, BackingInode: info.Inode, Flags: info.Flags}, nil
}

// Find returns the loop devices (/dev/loopN, in the kernel's order) bound
// to the file at path, matched by device and inode number, so a path
// reached through a symlink or another mount of the same filesystem finds
// them too. None is an empty result. The error is path's stat error.
func Find(path string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	var out []string
	for _, b := range bound() {
		s, err := GetStatus(b.dev)
		if err == nil && s.BackingDev == st.Dev && s.BackingInode == st.Ino {
			out = append(out, b.dev)
		}
	}
	return out, nil
}

// Under returns the loop devices (/dev/loopN) whose backing file's path,
// as the kernel recorded it when the device was bound, lies under the
// directory dir (an absolute path). It finds devices whose file was
// deleted or whose filesystem was unmounted since, which Find cannot.
func Under(dir string) []string {
	prefix := filepath.Clean(dir) + "/"
	var out []string
	for _, b := range bound() {
		if strings.HasPrefix(b.file, prefix) {
			out = append(out, b.dev)
		}
	}
	return out
}

// boundDevice is a loop device bound to a file and the file's path.
type boundDevice struct{ dev, file string }

// bound lists the loop devices bound to a file, from sysfs: only a bound
// device has loop/backing_file.
func bound() []boundDevice {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []boundDevice
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached since the glob
		}
		name := filepath.Base(filepath.Dir(filepath.Dir(f)))
		file := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		out = append(out, boundDevice{dev: "/dev/" + name, file: file})
	}
	return out
}

// Detach unbinds the loop device dev (/dev/loopN) from its file now
// (LOOP_CLR_FD). A device bound to nothing is not an error. While a
// mount holds the device the kernel defers the detach to the unmount, as
// if autoclear were set.
func Detach(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	return nil
}
