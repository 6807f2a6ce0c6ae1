package userns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Mapping maps sandbox ids to host ids: sandbox id i is host id HostID+i
// for i < Size (the same for uids and gids).
type Mapping struct {
	HostID, Size uint32
}

// NamespaceOptions describe one sandbox's namespaces.
type NamespaceOptions struct {
	// Owner is the slice whose first id creates (and so owns) the user
	// namespace.
	Owner Slice
	// Map is the namespace's id map; usually 0 → Owner.First for
	// SliceSize ids.
	Map Mapping
	// UserPath is a new file the user namespace is bind-mounted on.
	UserPath string
	// NetPath, when set, is a new file on which a network namespace owned
	// by the new user namespace is bind-mounted. A sandbox that joins a
	// user namespace can only join network namespaces owned by it (setns
	// needs CAP_SYS_ADMIN over the network namespace's owner).
	NetPath string
}

// unshareBin is util-linux's unshare(1). A Go program cannot make a user
// namespace for itself (unshare(CLONE_NEWUSER) needs a single-threaded
// caller) and os/exec makes a child's namespaces before it changes the
// child's uid, so the owner would be root: the holder process is unshare,
// started as the owner.
const unshareBin = "unshare"

var unshare struct {
	once sync.Once
	path string
	err  error
}

// unsharePath resolves unshare(1) once: an absolute path to a file owned
// by root that neither its group nor others may write, in a directory
// nobody but root may write either. The holder runs as the sandbox's
// namespace owner, with every capability over the sandbox's namespaces:
// a binary a host user could replace would hand them those.
func unsharePath() (string, error) {
	unshare.once.Do(func() {
		p, err := exec.LookPath(unshareBin)
		if err == nil {
			p, err = filepath.EvalSymlinks(p)
		}
		if err == nil {
			for _, q := range []string{p, filepath.Dir(p)} {
				var st unix.Stat_t
				if err = unix.Stat(q, &st); err != nil {
					break
				}
				if st.Uid != 0 || st.Mode&0o022 != 0 {
					err = fmt.Errorf("%s is not root's alone (uid %d, mode %o)", q, st.Uid, st.Mode&0o7777)
					break
				}
			}
		}
		if err != nil {
			unshare.err = fmt.Errorf("user namespaces: %s(1) from util-linux, owned by root, is needed: %w", unshareBin, err)
			return
		}
		unshare.path = p
	})
	return unshare.path, unshare.err
}

// CheckTools reports whether what Create runs is installed (and safe to
// run).
func CheckTools() error {
	_, err := unsharePath()
	return err
}

// Create makes the user namespace (and, with NetPath, a network namespace)
// of one sandbox and bind-mounts them on the option's paths, so that they
// outlive every process and runc can join them. A short-lived holder
// process running as opts.Owner.First unshares them; the daemon writes
// the id map and mounts the namespace files, then the holder exits. On
// error nothing is left.
func Create(ctx context.Context, opts NamespaceOptions) (retErr error) {
	bin, err := unsharePath()
	if err != nil {
		return err
	}
	args := []string{"--user"}
	if opts.NetPath != "" {
		args = append(args, "--net")
	}
	// The holder waits in sleep(1) until it is killed; it is ready once
	// its user namespace is no longer the daemon's.
	args = append(args, "--", "/bin/sleep", "60")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Pdeathsig fires when the thread that started the holder exits, not
	// the process (prctl(2) PR_SET_PDEATHSIG): a goroutine that locks that
	// thread and ends with it (runtime/runc's file takeover does) would
	// kill the holder before its namespaces are bound. Keep this
	// goroutine on the thread until the holder is gone.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	owner := opts.Owner.First
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: owner, Gid: owner, Groups: []uint32{}},
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
	var stderr strings.Builder
	cmd.Stderr = &limitedWriter{w: &stderr, n: 4096}
	self, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("user namespace holder: %w", err)
	}
	exited := make(chan error, 1)
	var bound []string
	defer func() {
		cmd.Process.Kill()
		<-exited
		if retErr != nil {
			for _, p := range bound {
				_ = RemoveFile(p)
			}
		}
	}()
	go func() { exited <- cmd.Wait() }()
	nsLink := fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid)
	for delay := 50 * time.Microsecond; ; delay = min(2*delay, 5*time.Millisecond) {
		if ns, err := os.Readlink(nsLink); err == nil && ns != self {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("user namespace holder did not start: %v: %s", err, stderr.String())
		case <-ctx.Done():
			return fmt.Errorf("user namespace holder did not start: %w", ctx.Err())
		case <-time.After(delay):
		}
	}
	pid := cmd.Process.Pid
	m := fmt.Sprintf("0 %d %d\n", opts.Map.HostID, opts.Map.Size)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(m), 0); err != nil {
			return fmt.Errorf("user namespace %s: %w", f, err)
		}
	}
	binds := [][2]string{{"user", opts.UserPath}}
	if opts.NetPath != "" {
		binds = append(binds, [2]string{"net", opts.NetPath})
	}
	for _, b := range binds {
		if err := bindNamespace(fmt.Sprintf("/proc/%d/ns/%s", pid, b[0]), b[1]); err != nil {
			return err
		}
		bound = append(bound, b[1])
	}
	return nil
}

// bindNamespace bind-mounts the namespace file ns on path (a new file).
func bindNamespace(ns, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("namespace file: %w", err)
	}
	f.Close()
	if err := unix.Mount(ns, path, "", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("bind %s: %w", ns, err)
	}
	return nil
}

// RemoveFile unmounts and removes a namespace file or mount point made by
// Create or MapMount; a missing or unmounted one is not an error.
func RemoveFile(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
