package userns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrIDMapUnsupported is returned when the filesystem under a path cannot
// be id-mapped (overlayfs on its own mount, for one; btrfs, ext4, XFS and
// tmpfs can).
var ErrIDMapUnsupported = errors.New("id-mapped mounts are not supported on this filesystem")

// MapMount bind-mounts the tree at src (recursively) on dst, an existing
// empty directory, id-mapped: a file whose owner on disk is From+i is
// owned by To+i (i < Size) when seen through dst, and a file created
// through dst by To+i is stored as From+i. Ids outside the map read as the
// overflow id (nobody) and cannot create files. The mount is nosuid and
// nodev. ErrIDMapUnsupported when
// src's filesystem cannot do it. Remove it with RemoveFile or Unmount.
func MapMount(src, dst string, from, to, size uint32) error {
	nsfd, err := mappings.get(from, to, size)
	if err != nil {
		return err
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(tree)
	// nosuid and nodev whatever the storage mount has: a sandbox's files
	// never carry privileges onto the host's side of the mount.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(nsfd)}
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

// PrepareMap makes (and keeps) the user namespace MapMount needs for the
// map from..from+size-1 to to..to+size-1, so that a later MapMount with
// that map starts no process: spare sandboxes prepare theirs ahead of
// the create that maps their files. Errors are those of making it.
func PrepareMap(from, to, size uint32) error {
	_, err := mappings.get(from, to, size)
	return err
}

// Unmount detaches the mount on dst; an unmounted or missing dst is not an
// error.
func Unmount(dst string) error {
	if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", dst, err)
	}
	return nil
}

// mappingCache keeps the user namespaces mount_setattr needs, one per id
// map: making one starts a process (milliseconds, most of an id-mapped
// mount's cost), and a slice's map is the same for every sandbox that
// gets the slice. Claims hands out the lowest free slices, so the maps in
// use stay about as many as the sandboxes at the busiest; past maxMappings
// the oldest are closed.
type mappingCache struct {
	mu    sync.Mutex
	fds   map[[3]uint32]int
	order [][3]uint32
}

// maxMappings bounds the cached namespace descriptors.
const maxMappings = 1024

var mappings = &mappingCache{fds: map[[3]uint32]int{}}

// get returns a cached descriptor for the map (owned by the cache: do not
// close it), making it when missing.
func (c *mappingCache) get(from, to, size uint32) (int, error) {
	key := [3]uint32{from, to, size}
	c.mu.Lock()
	if fd, ok := c.fds[key]; ok {
		c.mu.Unlock()
		return fd, nil
	}
	c.mu.Unlock()
	// Made without the lock: it starts a process, and other maps are
	// looked up meanwhile (a spare being made must not hold up a create).
	fd, err := mappingNamespace(from, to, size)
	if err != nil {
		return -1, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.fds[key]; ok { // made meanwhile by another caller
		unix.Close(fd)
		return old, nil
	}
	if len(c.order) >= maxMappings {
		old := c.order[0]
		c.order = c.order[1:]
		unix.Close(c.fds[old])
		delete(c.fds, old)
	}
	c.fds[key] = fd
	c.order = append(c.order, key)
	return fd, nil
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
