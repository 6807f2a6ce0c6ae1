package runc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
)

var _ runtime.FileTaker = (*Driver)(nil)

// TakeFiles gives spare sandbox id its files (runtime.FileTaker). All of
// it is done from the host, with nothing asked of the sandbox: the limits
// are written to its cgroups; the root and every mount are cloned on the
// host side (open_tree) with their flags set (mount_setattr); then a
// thread of this process enters the sandbox's mount namespace (setns,
// after unshare(CLONE_FS), which a thread of a Go program needs for it),
// attaches them under runtime.SpareNext (move_mount), moves the spare's
// own mounts over, and pivots the namespace's root there (pivot_root(".",
// "."), which moves the agent's root with it, as pivot_root(2) does for
// every process whose root was the old one), detaching the old root. The
// thread ends with its goroutine, never to run Go code elsewhere. Targets
// are opened with openat2 RESOLVE_IN_ROOT and RESOLVE_NO_SYMLINKS, so no
// link in the new files can point a mount elsewhere.
func (d *Driver) TakeFiles(ctx context.Context, id string, f runtime.Files) error {
	if !runtime.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	if err := d.cg.SetLimits(id, f.Limits); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	proc, err := d.spareInit(id)
	if err != nil {
		return err
	}
	defer unix.Close(proc)
	nsfd, err := unix.Openat(proc, "ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the spare's mount namespace: %w", err)
	}
	defer unix.Close(nsfd)

	root, err := cloneMount(f.RootFS, true, unix.MOUNT_ATTR_RDONLY)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	trees := make([]int, 0, len(f.Mounts))
	defer func() {
		for _, t := range trees {
			unix.Close(t)
		}
	}()
	for _, m := range f.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return fmt.Errorf("mount %s -> %s: paths must be absolute", m.Source, m.Target)
		}
		attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if m.ReadOnly {
			attr |= unix.MOUNT_ATTR_RDONLY
		}
		t, err := cloneMount(m.Source, false, attr)
		if err != nil {
			return err
		}
		trees = append(trees, t)
	}
	// The spare's mounts as its agent sees them (read here: inside, this
	// process's /proc is the sandbox's, whose pids it has none of).
	olds, err := rootChildren(proc)
	if err != nil {
		return err
	}
	return inMountNamespace(nsfd, func() error { return pivotInto(root, trees, f.Mounts, olds) })
}

// spareInit returns a /proc directory descriptor of sandbox id's init
// (its agent), which must be the only process of its cgroup. The
// descriptor pins that process: a pid reused after it died cannot be
// opened through it.
func (d *Driver) spareInit(id string) (int, error) {
	pids, err := d.cg.Procs(id)
	if err != nil {
		return -1, err
	}
	if len(pids) != 1 {
		return -1, fmt.Errorf("spare %s runs %d processes, not its agent alone: %w", id, len(pids), errdefs.ErrConflict)
	}
	fd, err := unix.Open("/proc/"+strconv.Itoa(pids[0]), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("spare %s's agent: %w", id, err)
	}
	// Still the sandbox's, and its init (pid 1 in its namespace)?
	ok, err := isSandboxInit(fd, id)
	if err != nil || !ok {
		unix.Close(fd)
		if err == nil {
			err = fmt.Errorf("spare %s's process %d is not its init: %w", id, pids[0], errdefs.ErrConflict)
		}
		return -1, err
	}
	return fd, nil
}

// isSandboxInit reports whether the process of /proc directory proc is in
// sandbox id's cgroup and is pid 1 of its pid namespace.
func isSandboxInit(proc int, id string) (bool, error) {
	read := func(name string) (string, error) {
		fd, err := unix.Openat(proc, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		b, err := io.ReadAll(f)
		return string(b), err
	}
	cg, err := read("cgroup")
	if err != nil {
		return false, err
	}
	if !strings.Contains(cg, "/"+id+"\n") {
		return false, nil
	}
	st, err := read("status")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(st, "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			return len(f) > 1 && f[len(f)-1] == "1", nil
		}
	}
	return false, nil
}

// cloneMount returns a detached copy of the mount at path (with its
// submounts when recursive) with attr set on it.
func cloneMount(path string, recursive bool, attr uint64) (int, error) {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, uint(flags))
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	// Private, whatever the source's propagation: a clone of a shared
	// mount joins its peer group, and pivot_root refuses a shared root
	// (systemd makes / shared); nor may a sandbox's mounts be peers of
	// the host's.
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE,
		&unix.MountAttr{Propagation: unix.MS_PRIVATE}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr %s (private): %w", path, err)
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attr}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr %s: %w", path, err)
	}
	return fd, nil
}

// inMountNamespace runs fn on a thread of its own that has entered the
// mount namespace nsfd. The thread is never given back to the Go
// scheduler: it ends when fn returns. The process's main thread is never
// used: the runtime keeps it after a goroutine locked to it ends, and
// /proc/self is its view, so it must stay in the host's namespace.
func inMountNamespace(nsfd int, fn func() error) error {
	for {
		errc := make(chan error, 1)
		go func() {
			goruntime.LockOSThread() // (never unlocked: the thread exits with this goroutine)
			if unix.Gettid() == unix.Getpid() {
				errc <- errMainThread // (this thread stays parked, unchanged)
				return
			}
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				errc <- fmt.Errorf("unshare CLONE_FS: %w", err)
				return
			}
			if err := unix.Setns(nsfd, unix.CLONE_NEWNS); err != nil {
				errc <- fmt.Errorf("enter the spare's mount namespace: %w", err)
				return
			}
			errc <- fn()
		}()
		if err := <-errc; err != errMainThread {
			return err
		}
	}
}

// errMainThread: inMountNamespace's goroutine ran on the main thread.
var errMainThread = errors.New("on the main thread")

// pivotInto runs in the spare's mount namespace: it attaches root at
// SpareNext and trees at mounts' targets in it, moves the namespace's
// current mounts olds (the direct children of its root) to the same
// paths in it, and makes it the root.
func pivotInto(root int, trees []int, mounts []runtime.Mount, olds []string) error {
	if err := unix.MoveMount(root, "", unix.AT_FDCWD, runtime.SpareNext, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the root: %w", err)
	}
	next, err := unix.Open(runtime.SpareNext, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(next)
	// As at a start: the kernel filesystems first, then the files'
	// mounts, then the sandbox's own files and the agent.
	var kernel, rest []string
	for _, p := range olds {
		switch {
		case p == runtime.SpareNext:
		case p == "/proc" || p == "/dev" || p == "/sys":
			kernel = append(kernel, p)
		default:
			rest = append(rest, p)
		}
	}
	move := func(ps []string) error {
		for _, p := range ps {
			if err := attach(next, p, func(t int) error {
				return unix.MoveMount(unix.AT_FDCWD, p, t, "", unix.MOVE_MOUNT_T_EMPTY_PATH)
			}); err != nil {
				return fmt.Errorf("move %s: %w", p, err)
			}
		}
		return nil
	}
	if err := move(kernel); err != nil {
		return err
	}
	for i, m := range mounts {
		if err := attach(next, m.Target, func(t int) error {
			return unix.MoveMount(trees[i], "", t, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		}); err != nil {
			return fmt.Errorf("mount %s: %w", m.Target, err)
		}
	}
	if err := move(rest); err != nil {
		return err
	}
	if err := unix.Fchdir(next); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the spare's root: %w", err)
	}
	return unix.Chdir("/")
}

// attach opens target (an absolute path, resolved inside root without
// following any symlink or leaving root) and calls fn with it.
func attach(root int, target string, fn func(fd int) error) error {
	rel := strings.TrimLeft(filepath.Clean(target), "/")
	if rel == "" {
		return fmt.Errorf("the root cannot be a mount target")
	}
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	defer unix.Close(fd)
	return fn(fd)
}

// rootChildren returns the mount points of the mounts directly on the
// root mount of the process of /proc directory proc, in mount order.
func rootChildren(proc int) ([]string, error) {
	fd, err := unix.Openat(proc, "mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "mountinfo")
	defer f.Close()
	path := "mountinfo"
	type entry struct{ id, parent, point string }
	var all []entry
	rootID := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mount-point options ... (proc(5))
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		e := entry{id: fs[0], parent: fs[1], point: unescapeMountinfo(fs[4])}
		if e.point == "/" {
			rootID = e.id // (the last one: mounts stacked on / hide those below)
		}
		all = append(all, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if rootID == "" {
		return nil, fmt.Errorf("%s: no root mount", path)
	}
	var out []string
	for _, e := range all {
		if e.parent == rootID && e.point != "/" {
			out = append(out, e.point)
		}
	}
	return out, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
