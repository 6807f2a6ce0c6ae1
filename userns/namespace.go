package userns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
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

// CheckTools reports whether what Create runs is installed.
func CheckTools() error {
	if _, err := exec.LookPath(unshareBin); err != nil {
		return fmt.Errorf("user namespaces: %s(1) from util-linux is needed: %w", unshareBin, err)
	}
	return nil
}

// Create makes the user namespace (and, with NetPath, a network namespace)
// of one sandbox and bind-mounts them on the option's paths, so that they
// outlive every process and runc can join them. A short-lived holder
// process running as opts.Owner.First unshares them; the daemon writes
// the id map and mounts the namespace files, then the holder exits. On
// error nothing is left.
func Create(ctx context.Context, opts NamespaceOptions) (retErr error) {
	args := []string{"--user"}
	if opts.NetPath != "" {
		args = append(args, "--net")
	}
	args = append(args, "--", "/bin/sh", "-c", "echo ready; read _; exit 0")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, unshareBin, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	owner := opts.Owner.First
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: owner, Gid: owner, Groups: []uint32{}},
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &limitedWriter{w: &stderr, n: 4096}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("user namespace holder: %w", err)
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil && retErr == nil {
			retErr = fmt.Errorf("user namespace holder: %w: %s", err, stderr.String())
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		return fmt.Errorf("user namespace holder did not start: %v: %s", err, stderr.String())
	}
	pid := cmd.Process.Pid
	m := fmt.Sprintf("0 %d %d\n", opts.Map.HostID, opts.Map.Size)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(m), 0); err != nil {
			cmd.Process.Kill()
			return fmt.Errorf("user namespace %s: %w", f, err)
		}
	}
	if err := bindNamespace(fmt.Sprintf("/proc/%d/ns/user", pid), opts.UserPath); err != nil {
		cmd.Process.Kill()
		return err
	}
	if opts.NetPath != "" {
		if err := bindNamespace(fmt.Sprintf("/proc/%d/ns/net", pid), opts.NetPath); err != nil {
			cmd.Process.Kill()
			_ = RemoveFile(opts.UserPath)
			return err
		}
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
