package userns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrIDMapUnsupported: the filesystem under a path cannot be id-mapped
// (overlayfs on its own mount, for one; btrfs, ext4, XFS and tmpfs can).
var ErrIDMapUnsupported = errors.New("id-mapped mounts are not supported on this filesystem")

// MapMount bind-mounts the tree at src (recursively) on dst, an existing
// empty directory, id-mapped: a file whose owner on disk is From+i is
// owned by To+i (i < Size) when seen through dst, and a file created
// through dst by To+i is stored as From+i. Ids outside the map read as the
// overflow id (nobody) and cannot create files. ErrIDMapUnsupported when
// src's filesystem cannot do it. Remove it with RemoveFile or Unmount.
func MapMount(src, dst string, from, to, size uint32) error {
	nsfd, err := mappingNamespace(from, to, size)
	if err != nil {
		return err
	}
	defer unix.Close(nsfd)
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(nsfd)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("%w (%s: %v)", ErrIDMapUnsupported, src, err)
		}
		return fmt.Errorf("id-map %s: %w", src, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount %s: %w", dst, err)
	}
	return nil
}

// Unmount detaches the mount on dst; an unmounted or missing dst is not an
// error.
func Unmount(dst string) error {
	if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", dst, err)
	}
	return nil
}

// mappingNamespace returns a descriptor of a user namespace whose id map
// takes from..from+size-1 to to..to+size-1: what mount_setattr needs to
// describe an id mapping. It starts a child in a new user namespace that
// stops (traced) at its exec, reads the namespace and kills the child.
func mappingNamespace(from, to, size uint32) (int, error) {
	m := []syscall.SysProcIDMap{{ContainerID: int(from), HostID: int(to), Size: int(size)}}
	// The tracer of the child is this thread: keep the goroutine on it
	// until the child is reaped.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"forkbox-idmap"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: m,
		GidMappings: m,
		// Stop at the exec, before any of our code runs in the child.
		Ptrace:    true,
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("id-map namespace: %w", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("id-map namespace: %w", &os.PathError{Op: "open", Path: "ns/user", Err: err})
	}
	return fd, nil
}
