// Package runsc is the gVisor isolation driver: each sandbox runs under
// runsc (platform systrap: no /dev/kvm needed), whose Sentry serves the
// sandbox's system calls in user space, so sandbox code never talks to the
// host kernel directly.
//
// The OCI bundle is runc's (runtime/runc.BuildSpec) minus what gVisor
// provides itself: the user namespace (the Sentry runs unprivileged), the
// cgroup namespace and mount, and the seccomp profile (the Sentry is the
// filter). The agent cannot accept on a listening socket handed in from the
// host (accept4 fails with EINVAL under gVisor), so it binds its own socket
// in a directory shared with the host (--host-uds=create), and the driver
// points the socket path the caller listens on at it.
//
// WORK IN PROGRESS (branch only): no memory snapshots yet.
package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/agent"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/runc"
)

// agentRunDir is where the agent's socket directory appears in the sandbox.
const agentRunDir = "/.forkbox/run"

// Options configure a Driver.
type Options struct {
	// Binary is the runsc executable; "" looks up "runsc" in PATH.
	Binary string
	// StateRoot is runsc's --root.
	StateRoot string
	// Platform is gVisor's platform; "" is systrap.
	Platform string
}

// Driver runs sandboxes with runsc. Create one with New.
type Driver struct {
	runsc *gorunc.Runc
	bin   string
	root  string
}

// New returns a driver over runsc; ErrUnavailable when it is not installed.
func New(opts Options) (*Driver, error) {
	bin := opts.Binary
	if bin == "" {
		bin = "runsc"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("gvisor driver: %w: %v", errdefs.ErrUnavailable, err)
	}
	if err := os.MkdirAll(opts.StateRoot, 0o700); err != nil {
		return nil, err
	}
	platform := opts.Platform
	if platform == "" {
		platform = "systrap"
	}
	args := []string{"--platform=" + platform, "--network=none", "--host-uds=create"}
	return &Driver{
		runsc: &gorunc.Runc{Command: path, Root: opts.StateRoot, Setpgid: true, ExtraArgs: args},
		bin:   path, root: opts.StateRoot,
	}, nil
}

var _ runtime.Driver = (*Driver)(nil)

// Name returns "gvisor".
func (d *Driver) Name() string { return "gvisor" }

// Capabilities: pause (the Sentry stops its tasks).
func (d *Driver) Capabilities() runtime.Capabilities { return runtime.Capabilities{Pause: true} }

// Create writes the bundle and runs the sandbox detached.
func (d *Driver) Create(ctx context.Context, cfg runtime.Config) (retErr error) {
	if !runc.ValidID(cfg.ID) {
		return errdefs.InvalidField("id", "must be 1-63 characters of [a-z0-9]")
	}
	hostSock, err := socketPath(cfg.AgentListener)
	if err != nil {
		return fmt.Errorf("%w: agent listener: %v", errdefs.ErrInvalidArgument, err)
	}
	runDir := filepath.Join(cfg.StateDir, "run")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return err
	}
	cfg.UIDMap, cfg.GIDMap = nil, nil
	spec, err := runc.BuildSpec(cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	adapt(spec, runDir)
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "config.json"), data, 0o600); err != nil {
		return err
	}
	// The caller dials hostSock: make it lead to the socket the agent binds
	// (through gVisor) in runDir.
	if err := os.Remove(hostSock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Symlink(filepath.Join(runDir, "agent.sock"), hostSock); err != nil {
		return err
	}
	logPath := filepath.Join(cfg.StateDir, "agent.log")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devNull.Close()
	defer func() {
		if retErr != nil {
			_ = d.Delete(context.WithoutCancel(ctx), cfg.ID)
		}
	}()
	opts := &gorunc.CreateOpts{IO: &fileIO{devNull, logFile, logFile}, Detach: true}
	if _, err := d.runsc.Run(ctx, cfg.ID, cfg.StateDir, opts); err != nil {
		b, _ := os.ReadFile(logPath)
		return fmt.Errorf("runsc run %s: %w: %v: %s", cfg.ID, errdefs.ErrInternal, err, lastBytes(b, 2048))
	}
	return nil
}

// adapt turns runc's spec into gVisor's.
func adapt(s *specs.Spec, runDir string) {
	var ns []specs.LinuxNamespace
	for _, n := range s.Linux.Namespaces {
		if n.Type != specs.UserNamespace && n.Type != specs.CgroupNamespace {
			ns = append(ns, n)
		}
	}
	s.Linux.Namespaces = ns
	s.Linux.UIDMappings, s.Linux.GIDMappings = nil, nil
	s.Linux.Seccomp = nil
	var mounts []specs.Mount
	for _, m := range s.Mounts {
		if m.Destination != "/sys/fs/cgroup" {
			mounts = append(mounts, m)
		}
	}
	mounts = append(mounts, specs.Mount{Destination: agentRunDir, Type: "bind", Source: runDir,
		Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}})
	s.Mounts = mounts
	s.Process.Env = append(s.Process.Env, agent.ListenEnv+"="+agentRunDir+"/agent.sock")
}

// socketPath returns the filesystem path a listening Unix socket is bound to.
func socketPath(f *os.File) (string, error) {
	if f == nil {
		return "", errors.New("none")
	}
	sa, err := unix.Getsockname(int(f.Fd()))
	if err != nil {
		return "", err
	}
	un, ok := sa.(*unix.SockaddrUnix)
	if !ok || un.Name == "" || un.Name[0] == '@' {
		return "", errors.New("not a Unix socket bound to a path")
	}
	return un.Name, nil
}

// Delete kills the sandbox and removes its state; an unknown id is fine.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if !runc.ValidID(id) {
		return nil
	}
	err := d.runsc.Delete(ctx, id, &gorunc.DeleteOpts{Force: true})
	if err != nil && !notExist(err) {
		return fmt.Errorf("runsc delete %s: %w", id, err)
	}
	return nil
}

// Status maps runsc state.
func (d *Driver) Status(ctx context.Context, id string) (runtime.Status, error) {
	c, err := d.runsc.State(ctx, id)
	if err != nil {
		if notExist(err) {
			return runtime.StatusUnknown, nil
		}
		return runtime.StatusUnknown, err
	}
	switch c.Status {
	case "running":
		return runtime.StatusRunning, nil
	case "paused":
		return runtime.StatusPaused, nil
	}
	return runtime.StatusStopped, nil
}

// List returns runsc's containers.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	cs, err := d.runsc.List(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// Stats reads runsc's one-shot event statistics.
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	st, err := d.runsc.Stats(ctx, id)
	if err != nil {
		if notExist(err) {
			return runtime.Stats{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s", id)
		}
		return runtime.Stats{}, err
	}
	out := runtime.Stats{}
	if st.Cpu.Usage.Total > 0 {
		out.CPUSeconds = float64(st.Cpu.Usage.Total) / 1e9
	}
	out.MemoryBytes = int64(st.Memory.Usage.Usage)
	out.MemoryPeakBytes = int64(st.Memory.Usage.Max)
	out.Pids = int64(st.Pids.Current)
	return out, nil
}

// KillProcessGroup signals process group pgid inside the sandbox through
// runsc exec (the Sentry delivers it; nothing in the sandbox can block a
// SIGKILL). It reports 1 when the signal was sent.
func (d *Driver) KillProcessGroup(ctx context.Context, id string, pgid int, sig int) (int, error) {
	if pgid <= 1 {
		return 0, errdefs.InvalidField("pgid", "must be a process group other than the agent's")
	}
	cmd := exec.CommandContext(ctx, d.bin, append(append([]string{"--root", d.root}, d.runsc.ExtraArgs...),
		"exec", "--user", "0:0", id, "/bin/kill", "-"+strconv.Itoa(sig), "--", "-"+strconv.Itoa(pgid))...)
	if out, err := cmd.CombinedOutput(); err != nil {
		if strings.Contains(string(out), "No such process") {
			return 0, nil
		}
		return 0, fmt.Errorf("runsc exec kill: %v: %s", err, lastBytes(out, 512))
	}
	return 1, nil
}

// Pause stops every task of the sandbox.
func (d *Driver) Pause(ctx context.Context, id string) error { return d.runsc.Pause(ctx, id) }

// Resume continues them.
func (d *Driver) Resume(ctx context.Context, id string) error { return d.runsc.Resume(ctx, id) }

func notExist(err error) bool {
	s := err.Error()
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT) ||
		strings.Contains(s, "does not exist") || strings.Contains(s, "not found")
}

func lastBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

type fileIO struct{ stdin, stdout, stderr *os.File }

func (f *fileIO) Close() error          { return nil }
func (f *fileIO) Stdin() io.WriteCloser { return nil }
func (f *fileIO) Stdout() io.ReadCloser { return nil }
func (f *fileIO) Stderr() io.ReadCloser { return nil }
func (f *fileIO) Set(cmd *exec.Cmd)     { cmd.Stdin, cmd.Stdout, cmd.Stderr = f.stdin, f.stdout, f.stderr }
