// Package runsc is the gVisor isolation driver: each sandbox runs under
// runsc (platform systrap: no /dev/kvm needed), whose Sentry serves the
// sandbox's system calls in user space, so sandbox code never talks to the
// host kernel directly.
//
// The OCI bundle is the one every OCI driver starts from (ocispec.Build)
// minus what gVisor provides itself (the cgroup namespace, and the seccomp
// profile: the Sentry is the filter), with room for the Sentry in the host
// cgroup and the pids limit enforced inside; gvisorOpts lists the changes. The agent cannot accept on a listening socket handed in from the
// host (accept4 fails with EINVAL under gVisor), so it binds its own socket
// in a directory shared with the host (--host-uds=create), and the driver
// points the socket path the caller listens on at it.
package runsc

import (
	"context"
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
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/bundle"
	"github.com/forkbox/forkbox/runtime/cgroupv1"
	"github.com/forkbox/forkbox/runtime/ocispec"
)

// Options configure a Driver.
type Options struct {
	// Binary is the runsc executable; "" is PinnedBinary when installed,
	// else "runsc" in PATH.
	Binary string
	// StateRoot is runsc's --root.
	StateRoot string
	// Platform is gVisor's platform; "" is systrap.
	Platform string
	// Restore is how restores read a checkpoint: RestoreAuto (""),
	// RestorePlain, RestoreDirect, RestoreBackground or
	// RestoreDirectBackground.
	Restore string
	// CgroupParent is the host cgroup under which sandboxes' cgroups are
	// made (the daemon's datadir.HostNames.CgroupParent); "" is
	// cgroupv1.LegacyParent.
	CgroupParent string
}

// Driver runs sandboxes with runsc. Create one with New.
type Driver struct {
	// runsc runs sandboxes without a network, runscNet those that join a
	// network namespace (Config.NetnsPath): see network.go.
	runsc    *gorunc.Runc
	runscNet *gorunc.Runc
	bin      string
	version  string // runsc --version's
	// restoreArgs are added to runsc restore (Options.Restore), and
	// --direct for a checkpoint on a disk when autoDirect.
	restoreArgs []string
	autoDirect  bool
	root        string
	cg          *cgroupv1.Cgroups

	// locks serialise Pause, Resume and KillProcessGroup per sandbox id.
	mu    sync.Mutex
	locks map[string]*idLock

	// sentries caches each sandbox's Sentry process for Sample, which
	// must notice a Sentry that died (its gofer can keep the cgroup
	// alive) without asking runsc every time.
	sentryMu sync.Mutex
	sentries map[string]process
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

// New returns a driver over runsc (see Options.Binary); ErrUnavailable
// when it is not installed or does not say its version.
func New(opts Options) (*Driver, error) {
	path, err := findBinary(opts.Binary)
	if err != nil {
		return nil, err
	}
	version, err := binaryVersion(context.Background(), path)
	if err != nil {
		return nil, fmt.Errorf("gvisor driver: %w: %v", errdefs.ErrUnavailable, err)
	}
	restore, autoDirect, err := restoreArgs(context.Background(), path, opts.Restore)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.StateRoot, 0o700); err != nil {
		return nil, err
	}
	platform := opts.Platform
	if platform == "" {
		platform = "systrap"
	}
	args := []string{"--platform=" + platform, networkNone, "--host-uds=create"}
	netArgs := []string{"--platform=" + platform, networkSandbox, "--host-uds=create"}
	return &Driver{
		runsc:    &gorunc.Runc{Command: path, Root: opts.StateRoot, Setpgid: true, ExtraArgs: args},
		runscNet: &gorunc.Runc{Command: path, Root: opts.StateRoot, Setpgid: true, ExtraArgs: netArgs},
		bin:      path, version: version, restoreArgs: restore, autoDirect: autoDirect, root: opts.StateRoot, cg: cgroupv1.New(opts.CgroupParent),
		locks: map[string]*idLock{}, sentries: map[string]process{},
	}, nil
}

var _ runtime.Driver = (*Driver)(nil)

// DriverName is the gVisor driver's name in the API (isolation "gvisor").
const DriverName = "gvisor"

// Name returns DriverName.
func (d *Driver) Name() string { return DriverName }

// Capabilities says what the gVisor tier offers: pause (the Sentry stops its tasks), memory snapshots that
// restore any number of times (fork); the memory limit is
// the host cgroup's, shared with the Sentry, so going over it stops the
// whole sandbox.
func (d *Driver) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, MemorySnapshot: true, Fork: true, SandboxOOM: true, UserNamespace: true, Network: true}
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
	if !runtime.ValidID(cfg.ID) {
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
	spec, err := ocispec.Build(cfg, append([]ocispec.SpecOpts{ocispec.WithCgroupsPath(d.cg.SpecPath(cfg.ID))},
		gvisorOpts(runDir, cfg.ControlDir)...)...)
	if err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	if err := bundle.WriteSpec(cfg.StateDir, spec); err != nil {
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
	stdio, err := bundle.OpenAgentStdio(cfg.StateDir)
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
		rs := d.runner(cfg.NetnsPath != "")
		if cfg.WritableRoot {
			// runsc's default (--overlay2=root:self) keeps the root's
			// writes in a memory-backed upper layer of its own; a build
			// step's writes must reach the writable layer its snapshot takes.
			cp := *rs
			cp.ExtraArgs = append(append([]string(nil), rs.ExtraArgs...), "--overlay2=none")
			rs = &cp
		}
		if _, err := rs.Run(ctx, cfg.ID, cfg.StateDir, opts); err != nil {
			return runtime.AsMountError(fmt.Errorf("runsc run %s: %w: %v: %s", cfg.ID, errdefs.ErrInternal, err,
				summary([]byte(stdio.Tail(8192)))))
		}
		return nil
	}
	args := append([]string{"restore", "--detach"}, d.directFor(image)...)
	cmd := d.commandNet(ctx, cfg.NetnsPath != "", append(args, "--image-path", image, "--bundle", cfg.StateDir, cfg.ID)...)
	stdio.Set(cmd)
	if err := cmd.Run(); err != nil {
		return runtime.AsMountError(fmt.Errorf("runsc restore %s: %w: %v: %s", cfg.ID, errdefs.ErrInternal, err,
			summary([]byte(stdio.Tail(8192)))))
	}
	return nil
}

// command returns a runsc command with the driver's global flags (those of
// a sandbox without a network; runsc reads --network only where a sandbox
// is started or checkpointed, see commandNet).
func (d *Driver) command(ctx context.Context, args ...string) *exec.Cmd {
	return d.commandNet(ctx, false, args...)
}

// commandNet returns a runsc command with the global flags of a sandbox
// with a network (networked) or without.
func (d *Driver) commandNet(ctx context.Context, networked bool, args ...string) *exec.Cmd {
	global := append([]string{"--root", d.root}, d.runner(networked).ExtraArgs...)
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
	if !runtime.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	defer d.lock(id)()
	// --leave-running restores the sandbox in place, which must be given
	// the flags it was started with (runsc's checkpoint documentation).
	cmd := d.commandNet(ctx, d.networked(id), "checkpoint", "--leave-running", "--compression=none", "--image-path", dir, id)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if notExist(errors.New(string(out))) {
			return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s", id)
		}
		return errdefs.Newf(errdefs.ErrConflict, "runsc checkpoint %s: %v: %s", id, err, summary(out))
	}
	return nil
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
	if !runtime.ValidID(id) {
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
	if err := d.releaseIfIdle(); err != nil {
		return fmt.Errorf("runsc delete %s: %w", id, err)
	}
	return nil
}

// KillProcessGroup signals process group pgid inside the sandbox: the
// Sentry owns the sandbox's processes, so the driver runs the agent binary
// in its kill-group mode through runsc exec (a new process the Sentry
// starts as root; nothing in the sandbox can block its SIGKILL). It returns
// how many processes were in the group. runsc cannot exec in a paused
// sandbox: there the sandbox is resumed for the kill (a few tens of ms in
// which its processes run) and paused again.
func (d *Driver) KillProcessGroup(ctx context.Context, id string, pgid int, sig int) (int, error) {
	if !runtime.ValidID(id) || pgid <= 1 {
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
	if !runtime.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	defer d.lock(id)()
	return d.runsc.Pause(ctx, id)
}

// Resume continues them.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	defer d.lock(id)()
	return d.runsc.Resume(ctx, id)
}
