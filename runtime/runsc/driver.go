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
package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/runc"
)

// agentRunDir is where the agent's socket directory appears in the sandbox.
const agentRunDir = "/.forkbox/run"

// runtimeHeadroom is the memory, in bytes, added to a sandbox's cgroup
// limit for gVisor's own processes (Sentry and gofer: about 40 MiB each at
// rest, measured here with runsc 2024-07-29).
const runtimeHeadroom = 96 << 20

// runDirBytes and runDirInodes bound the tmpfs of the agent's socket
// directory (it holds one socket).
const (
	runDirBytes  = 64 << 10
	runDirInodes = 16
)

// Tasks inside a gVisor sandbox are the Sentry's, not the host's, so the
// host cgroup's pids limit does not count them: it counts the Sentry's and
// gofer's host threads and systrap's stub processes, and when it refuses
// one the Sentry cannot go on and the whole sandbox stops. The sandbox's
// own limit is therefore enforced inside, by the Sentry: RLIMIT_NPROC of
// Limits.Pids tasks (processes and threads) per user of the sandbox (the
// Sentry counts per real uid, as Linux does, and exempts a creator with
// CAP_SYS_ADMIN: the agent can always start a command). The host limit is
// set well above what that lets one or two users run: hostTasksPerTask
// host tasks per allowed task plus runtimePidsHeadroom. Measured with runsc
// 2024-07-29 (systrap) on the reference machine: an idle sandbox holds 22
// host tasks; a fork bomb of one user at 512 tasks, 738; bombs of the user
// and root at once (1024 tasks), 830.
const (
	runtimePidsHeadroom = 256
	hostTasksPerTask    = 2
)

// Options configure a Driver.
type Options struct {
	// Binary is the runsc executable; "" looks up "runsc" in PATH.
	Binary string
	// StateRoot is runsc's --root.
	StateRoot string
	// Platform is gVisor's platform; "" is systrap.
	Platform string
	// CgroupParent is the host cgroup under which sandboxes' cgroups are
	// made (the daemon's storage.HostNames.CgroupParent); "" is
	// runc.LegacyCgroupParent.
	CgroupParent string
}

// Driver runs sandboxes with runsc. Create one with New.
type Driver struct {
	runsc *gorunc.Runc
	bin   string
	root  string
	cg    *runc.Cgroups

	// locks serialise Pause, Resume and KillProcessGroup per sandbox id.
	mu    sync.Mutex
	locks map[string]*idLock

	// sentries caches each sandbox's Sentry process for Sample, which
	// must notice a Sentry that died (its gofer can keep the cgroup
	// alive) without asking runsc every time.
	sentryMu sync.Mutex
	sentries map[string]process
}

// process names a host process across pid reuse: its pid and its start
// time (field 22 of /proc/PID/stat, in clock ticks since boot).
type process struct {
	pid   int
	start string
}

// startTime reads the start time of host pid.
func startTime(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:])) // field 3 onwards
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return f[19], nil
}

// sentryAlive reports whether sandbox id's Sentry process still runs. The
// first call asks runsc for its pid (one runsc process per sandbox); later
// ones read /proc only.
func (d *Driver) sentryAlive(ctx context.Context, id string) bool {
	d.sentryMu.Lock()
	p, ok := d.sentries[id]
	d.sentryMu.Unlock()
	if !ok {
		c, err := d.runsc.State(ctx, id)
		if err != nil || c.Pid <= 0 {
			return false
		}
		start, err := startTime(c.Pid)
		if err != nil {
			return false
		}
		p = process{pid: c.Pid, start: start}
		d.sentryMu.Lock()
		d.sentries[id] = p
		d.sentryMu.Unlock()
	}
	start, err := startTime(p.pid)
	return err == nil && start == p.start
}

type idLock struct {
	sync.Mutex
	users int
}

// lock takes id's lifecycle lock; the returned func releases it.
func (d *Driver) lock(id string) func() {
	d.mu.Lock()
	l := d.locks[id]
	if l == nil {
		l = &idLock{}
		d.locks[id] = l
	}
	l.users++
	d.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		d.mu.Lock()
		if l.users--; l.users == 0 {
			delete(d.locks, id)
		}
		d.mu.Unlock()
	}
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
		bin:   path, root: opts.StateRoot, cg: runc.NewCgroups(opts.CgroupParent),
		locks: map[string]*idLock{}, sentries: map[string]process{},
	}, nil
}

var _ runtime.Driver = (*Driver)(nil)

// DriverName is the gVisor driver's name in the API (isolation "gvisor").
const DriverName = "gvisor"

// Name returns DriverName.
func (d *Driver) Name() string { return DriverName }

// Capabilities: pause (the Sentry stops its tasks), memory snapshots that
// restore any number of times (fork); the memory limit is
// the host cgroup's, shared with the Sentry, so going over it stops the
// whole sandbox.
func (d *Driver) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, MemorySnapshot: true, Fork: true, SandboxOOM: true, UserNamespace: true}
}

// Create writes the bundle and runs the sandbox detached.
func (d *Driver) Create(ctx context.Context, cfg runtime.Config) error {
	return d.start(ctx, cfg, "")
}

// Restore writes the bundle and restores the checkpoint in dir into it
// (runsc restore), detached. The agent, prepared before the checkpoint,
// listens again once cfg.ControlDir holds its wire.ResumeFile.
func (d *Driver) Restore(ctx context.Context, cfg runtime.Config, dir string) error {
	if dir == "" {
		return errdefs.InvalidField("image", "a checkpoint directory is required")
	}
	return d.start(ctx, cfg, dir)
}

// start writes cfg's bundle into cfg.StateDir and runs it: a new sandbox,
// or the checkpoint in image when image is not "".
func (d *Driver) start(ctx context.Context, cfg runtime.Config, image string) (retErr error) {
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
	// Recorded before anything is mounted: Delete finds the mount through
	// it even when runsc has forgotten the sandbox.
	if err := d.recordBundle(cfg.ID, cfg.StateDir); err != nil {
		return fmt.Errorf("record the bundle of %s: %w", cfg.ID, err)
	}
	// The agent (sandbox root) creates its socket there. Root in the
	// sandbox can write there too: a tiny tmpfs keeps that off the host's
	// disk (the writable layer has a quota; this directory would not).
	if err := unix.Mount("tmpfs", runDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", runDirBytes, runDirInodes,
			hostID(cfg.UIDMap, 0), hostID(cfg.GIDMap, 0))); err != nil {
		return fmt.Errorf("agent socket directory: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = unix.Unmount(runDir, unix.MNT_DETACH)
		}
	}()
	spec, err := runc.BuildSpec(cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	spec.Linux.CgroupsPath = d.cg.SpecPath(cfg.ID)
	adapt(spec, runDir, cfg.ControlDir)
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
	stdio, err := runc.OpenAgentStdio(cfg.StateDir)
	if err != nil {
		return err
	}
	defer stdio.Close()
	defer func() {
		if retErr != nil {
			_ = d.Delete(context.WithoutCancel(ctx), cfg.ID)
		}
	}()
	if image == "" {
		opts := &gorunc.CreateOpts{IO: stdio, Detach: true}
		if _, err := d.runsc.Run(ctx, cfg.ID, cfg.StateDir, opts); err != nil {
			return runtime.AsMountError(fmt.Errorf("runsc run %s: %w: %v: %s", cfg.ID, errdefs.ErrInternal, err,
				summary([]byte(stdio.Tail(8192)))))
		}
		return nil
	}
	cmd := d.command(ctx, "restore", "--detach", "--image-path", image, "--bundle", cfg.StateDir, cfg.ID)
	stdio.Set(cmd)
	if err := cmd.Run(); err != nil {
		return runtime.AsMountError(fmt.Errorf("runsc restore %s: %w: %v: %s", cfg.ID, errdefs.ErrInternal, err,
			summary([]byte(stdio.Tail(8192)))))
	}
	return nil
}

// command returns a runsc command with the driver's global flags.
func (d *Driver) command(ctx context.Context, args ...string) *exec.Cmd {
	global := append([]string{"--root", d.root}, d.runsc.ExtraArgs...)
	cmd := exec.CommandContext(ctx, d.bin, append(global, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// Checkpoint saves the sandbox into dir (runsc checkpoint --leave-running,
// uncompressed: the pages are encrypted afterwards and compression costs
// more time than it saves here). A paused sandbox stays paused. It fails
// with ErrConflict when the sandbox holds something gVisor cannot save,
// such as a bound host socket (an agent that was not prepared).
func (d *Driver) Checkpoint(ctx context.Context, id, dir string) error {
	if !runc.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	defer d.lock(id)()
	cmd := d.command(ctx, "checkpoint", "--leave-running", "--compression=none", "--image-path", dir, id)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if notExist(errors.New(string(out))) {
			return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s", id)
		}
		return errdefs.Newf(errdefs.ErrConflict, "runsc checkpoint %s: %v: %s", id, err, summary(out))
	}
	return nil
}

// adminCaps are granted to the agent in gVisor so that it can set a
// restored clone's hostname. They are in its effective and permitted sets
// but not in its bounding set: the Sentry gives the container's first
// process the spec's sets as they are, and a program the agent executes
// gets at most its bounding set, so nothing it starts, root included, can
// have them. (The agent once dropped them from its bounding set itself,
// which needs a system call on every thread that Go refuses in a binary
// built with cgo.)
var adminCaps = []string{"CAP_SYS_ADMIN"}

// adapt turns runc's spec into gVisor's.
func adapt(s *specs.Spec, runDir, controlDir string) {
	var ns []specs.LinuxNamespace
	for _, n := range s.Linux.Namespaces {
		if n.Type != specs.CgroupNamespace {
			ns = append(ns, n)
		}
	}
	s.Linux.Namespaces = ns
	s.Linux.Seccomp = nil
	// The Sentry and the gofer share the sandbox's memory cgroup: give
	// them room of their own on top of what the sandbox may use.
	if m := s.Linux.Resources.Memory; m != nil && m.Limit != nil {
		limit := *m.Limit + runtimeHeadroom
		m.Limit, m.Swap = &limit, &limit
	}
	// The sandbox's tasks are limited inside; the host limit leaves the
	// Sentry room above that (see hostTasksPerTask).
	if p := s.Linux.Resources.Pids; p != nil && p.Limit != nil {
		tasks := uint64(*p.Limit)
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: tasks, Soft: tasks})
		limit := *p.Limit*hostTasksPerTask + runtimePidsHeadroom
		p.Limit = &limit
	}
	mounts := append([]specs.Mount(nil), s.Mounts...)
	mounts = append(mounts, specs.Mount{Destination: agentRunDir, Type: "bind", Source: runDir,
		Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}})
	if controlDir != "" {
		mounts = append(mounts, specs.Mount{Destination: runtime.ControlTarget, Type: "bind", Source: controlDir,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
		s.Process.Env = append(s.Process.Env, wire.ControlEnv+"="+runtime.ControlTarget+"/"+runtime.ControlFile)
	}
	s.Mounts = mounts
	s.Process.Env = append(s.Process.Env, wire.ListenEnv+"="+agentRunDir+"/agent.sock")
	c := s.Process.Capabilities
	c.Effective = append(append([]string(nil), c.Effective...), adminCaps...)
	c.Permitted = append(append([]string(nil), c.Permitted...), adminCaps...)
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

// Delete kills the sandbox and removes its state, cgroups and the mount
// of its agent socket directory; an unknown id is fine. It finishes
// whatever an earlier, interrupted Delete left (runsc may have forgotten
// the sandbox already: the bundle is then found through the driver's own
// record of it).
func (d *Driver) Delete(ctx context.Context, id string) error {
	if !runc.ValidID(id) {
		return nil
	}
	d.sentryMu.Lock()
	delete(d.sentries, id)
	d.sentryMu.Unlock()
	bundle := ""
	if c, err := d.runsc.State(ctx, id); err == nil {
		bundle = c.Bundle
	}
	if bundle == "" {
		bundle, _ = os.Readlink(d.bundleRecord(id))
	}
	err := d.runsc.Delete(ctx, id, &gorunc.DeleteOpts{Force: true})
	if err != nil && !notExist(err) {
		return fmt.Errorf("runsc delete %s: %w", id, err)
	}
	if bundle != "" {
		if err := unix.Unmount(filepath.Join(bundle, "run"), unix.MNT_DETACH); err != nil &&
			!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount the agent socket directory of %s: %w", id, err)
		}
	}
	// A sandbox whose Sentry died (an OOM kill) can leave its gofer and
	// stub processes behind after runsc forgets it: kill what is left in
	// its cgroups and remove them.
	if err := d.cg.Remove(ctx, id); err != nil {
		return fmt.Errorf("runsc delete %s: %w", id, err)
	}
	if err := os.Remove(d.bundleRecord(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("runsc delete %s: %w", id, err)
	}
	return nil
}

// bundlesDir holds the driver's record of each sandbox's bundle, in the
// runsc state root (runsc only reads its own files there).
const bundlesDir = "forkbox-bundles"

// bundleRecord is the path of sandbox id's bundle record: a symbolic link
// to its bundle directory.
func (d *Driver) bundleRecord(id string) string { return filepath.Join(d.root, bundlesDir, id) }

// recordBundle records that sandbox id's bundle is dir (replacing an older
// record of the id).
func (d *Driver) recordBundle(id, dir string) error {
	p := d.bundleRecord(id)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink(dir, p)
}

// StopCause tells why sandbox id stopped by itself: StopPidsLimit when its
// host cgroup's pids limit refused a task (the Sentry cannot go on after
// that), StopMemoryLimit when the kernel killed one of its processes at
// the memory limit, else StopUnknown. It must be called before Delete
// removes the cgroups.
func (d *Driver) StopCause(ctx context.Context, id string) runtime.StopCause {
	if n, err := d.cg.PidsLimitHits(id); err == nil && n > 0 {
		return runtime.StopPidsLimit
	}
	if n, err := d.cg.OOMKills(id); err == nil && n > 0 {
		return runtime.StopMemoryLimit
	}
	return runtime.StopUnknown
}

var _ runtime.StopExplainer = (*Driver)(nil)

// startScale is how much longer than a runc sandbox a gVisor sandbox may
// take to start: runsc boots the Sentry, the gofer and the agent (about
// 1 s here, against 0.1 s for runc), and a restore reads a whole
// checkpoint.
const startScale = 3

// StartScale returns startScale (runtime.StartScaler).
func (d *Driver) StartScale() float64 { return startScale }

var _ runtime.StartScaler = (*Driver)(nil)

// Status maps runsc state.
func (d *Driver) Status(ctx context.Context, id string) (runtime.Status, error) {
	c, err := d.runsc.State(ctx, id)
	if err != nil {
		if notExist(err) {
			return runtime.StatusUnknown, nil
		}
		return runtime.StatusUnknown, err
	}
	// runsc keeps reporting a sandbox whose Sentry died (an OOM kill) as
	// it last saw it: its process must still be there.
	if c.Pid <= 0 || unix.Kill(c.Pid, 0) == unix.ESRCH {
		return runtime.StatusStopped, nil
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

var _ runtime.Sampler = (*Driver)(nil)

// Sample reads the sandbox's host cgroups for the host monitor
// (runtime.Sampler) instead of asking runsc, which would start a runsc
// process per sandbox per round (about 50 ms each on an idle 2-core
// host, seconds on a loaded one); runsc is asked once per sandbox, for
// its Sentry's pid. CPUSeconds is then the host CPU of the
// whole sandbox, the Sentry and gofer included (what its CPU quota caps);
// Pids and PidsLimit are the host tasks of the sandbox and their limit,
// which has headroom for the runtime's own threads. A sandbox whose
// Sentry is gone (killed over its memory) is ErrNotFound, as for Stats.
func (d *Driver) Sample(ctx context.Context, id string) (runtime.Stats, error) {
	if !runc.ValidID(id) {
		return runtime.Stats{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	if !d.sentryAlive(ctx, id) {
		return runtime.Stats{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s: its Sentry is not running", id)
	}
	return d.cg.Sample(id)
}

// KillProcessGroup signals process group pgid inside the sandbox: the
// Sentry owns the sandbox's processes, so the driver runs the agent binary
// in its kill-group mode through runsc exec (a new process the Sentry
// starts as root; nothing in the sandbox can block its SIGKILL). It returns
// how many processes were in the group. runsc cannot exec in a paused
// sandbox: there the sandbox is resumed for the kill (a few tens of ms in
// which its processes run) and paused again.
func (d *Driver) KillProcessGroup(ctx context.Context, id string, pgid int, sig int) (int, error) {
	if !runc.ValidID(id) || pgid <= 1 {
		return 0, errdefs.InvalidField("pgid", "must name a process group other than the agent's")
	}
	defer d.lock(id)()
	if st, err := d.Status(ctx, id); err == nil && st == runtime.StatusPaused {
		if err := d.runsc.Resume(ctx, id); err != nil {
			return 0, fmt.Errorf("resume %s for a kill: %w", id, err)
		}
		defer func() {
			if err := d.runsc.Pause(context.WithoutCancel(ctx), id); err != nil {
				_ = err // the next Status shows it running; Pause again fixes it
			}
		}()
	}
	cmd := d.command(ctx, "exec", "--user", "0:0", id, runtime.AgentTarget, wire.KillGroupCommand,
		strconv.Itoa(pgid), strconv.Itoa(sig))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if notExist(errors.New(stderr.String())) {
			return 0, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s", id)
		}
		return 0, fmt.Errorf("runsc exec kill-group in %s: %v: %s", id, err, lastBytes([]byte(stderr.String()), 512))
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return 0, fmt.Errorf("runsc exec kill-group in %s: bad answer %q", id, out)
	}
	return n, nil
}

// Pause stops every task of the sandbox (runsc pause: the Sentry stops its
// tasks; its own threads stay).
func (d *Driver) Pause(ctx context.Context, id string) error {
	if !runc.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	defer d.lock(id)()
	return d.runsc.Pause(ctx, id)
}

// Resume continues them.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if !runc.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	defer d.lock(id)()
	return d.runsc.Resume(ctx, id)
}

func notExist(err error) bool {
	s := err.Error()
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT) ||
		strings.Contains(s, "does not exist") || strings.Contains(s, "not found")
}

// summary picks what explains a runsc failure out of its output (which
// may end in a Go stack trace): the lines that speak of an error, at most
// three, else the last 1 KiB.
func summary(out []byte) string {
	var picked []string
	for _, line := range strings.Split(string(out), "\n") {
		l := strings.ToLower(line)
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(l, "goroutine ") {
			continue
		}
		if strings.Contains(l, "error") || strings.Contains(l, "cannot") || strings.Contains(l, "failed") ||
			strings.Contains(l, "panic") {
			picked = append(picked, strings.TrimSpace(line))
			if len(picked) == 3 {
				break
			}
		}
	}
	if len(picked) == 0 {
		return lastBytes(out, 1024)
	}
	return lastBytes([]byte(strings.Join(picked, "; ")), 1024)
}

func lastBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// hostID returns the host id that sandbox id maps to (id itself without a map).
func hostID(m []runtime.IDMap, id uint32) int {
	for _, e := range m {
		if id >= e.ContainerID && id-e.ContainerID < e.Size {
			return int(e.HostID + id - e.ContainerID)
		}
	}
	return int(id)
}

// Processes lists the sandbox's processes as the Sentry sees them
// (runsc ps --format=json): in-sandbox pids and command names, no command
// lines. ErrNotFound for an unknown sandbox.
func (d *Driver) Processes(ctx context.Context, id string) ([]runtime.Process, error) {
	if !runc.ValidID(id) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	out, err := d.command(ctx, "ps", "--format=json", id).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && notExist(errors.New(string(ee.Stderr))) {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s", id)
		}
		return nil, fmt.Errorf("runsc ps %s: %w", id, err)
	}
	var ps []struct {
		PID int    `json:"pid"`
		Cmd string `json:"cmd"`
	}
	if err := json.Unmarshal(out, &ps); err != nil {
		return nil, fmt.Errorf("runsc ps %s: %w", id, err)
	}
	procs := make([]runtime.Process, 0, len(ps))
	for _, p := range ps {
		procs = append(procs, runtime.Process{Pid: p.PID, Name: p.Cmd})
	}
	return procs, nil
}
