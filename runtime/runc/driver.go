// Package runc is the container-tier isolation driver: each sandbox is a runc
// container in its own pid, mount, ipc, uts, network, cgroup and user
// namespaces, with cgroup v1 limits, a seccomp filter and a minimal capability
// set. runc is driven through its CLI (containerd/go-runc); resource readings,
// pause and out-of-band kills go straight to the cgroup v1 files.
package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	gorunc "github.com/containerd/go-runc"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/bundle"
	"github.com/forkbox/forkbox/runtime/cgroupv1"
	"github.com/forkbox/forkbox/runtime/ocispec"
)

// Driver runs sandboxes with the runc CLI. Create one with New.
type Driver struct {
	runc *gorunc.Runc
	cg   *cgroupv1.Cgroups

	// freezeMu holds a *sync.Mutex per sandbox id that orders its freezer
	// changes: KillProcessGroup's freeze-signal-thaw is one step, so a
	// Pause that lands in the middle is not undone by the kill's thaw (the
	// sandbox would run while its session says paused).
	freezeMu sync.Map
}

// freezer locks sandbox id's freezer changes; the caller calls the
// returned function to unlock.
func (d *Driver) freezer(id string) func() {
	v, _ := d.freezeMu.LoadOrStore(id, new(sync.Mutex))
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// Options configure a Driver.
type Options struct {
	// Binary is the runc executable; "" looks up "runc" in PATH.
	Binary string
	// StateRoot is runc's --root: where it keeps container state. forkbox
	// gives runc a root of its own so List sees only forkbox's sandboxes.
	StateRoot string
	// CgroupParent is the cgroup under which sandboxes' cgroups are made
	// (the daemon's datadir.HostNames.CgroupParent); "" is
	// cgroupv1.LegacyParent.
	CgroupParent string
}

// New returns a driver over the runc binary. It fails with ErrUnavailable
// when runc is not installed.
func New(opts Options) (*Driver, error) {
	bin := opts.Binary
	if bin == "" {
		bin = "runc"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("runc driver: %w: %v", errdefs.ErrUnavailable, err)
	}
	if err := os.MkdirAll(opts.StateRoot, 0o700); err != nil {
		return nil, fmt.Errorf("runc driver: %w", err)
	}
	return &Driver{runc: &gorunc.Runc{Command: path, Root: opts.StateRoot, Setpgid: true}, cg: cgroupv1.New(opts.CgroupParent)}, nil
}

var _ runtime.Driver = (*Driver)(nil)

// Name returns "runc".
func (d *Driver) Name() string { return "runc" }

// Capabilities says what the runc tier offers: pause through the freezer, user namespaces (its own or
// one the host made: Config.UserNamespace); no memory
// snapshots (runc needs CRIU for those, which does not work on the hosts
// forkbox targets).
func (d *Driver) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, Network: true, UserNamespace: true, JoinUserNamespace: true}
}

// Create writes the OCI bundle into cfg.StateDir and runs `runc run
// --detach` with the agent as init and cfg.AgentListener as fd 3. The
// agent's stdout and stderr go to StateDir/agent.log. On failure the
// container is deleted and the error carries runc's message.
func (d *Driver) Create(ctx context.Context, cfg runtime.Config) (retErr error) {
	if !runtime.ValidID(cfg.ID) {
		return errdefs.InvalidField("id", "must be 1-63 characters of [a-z0-9]")
	}
	spec, err := ocispec.Build(cfg, ocispec.WithCgroupsPath(d.cg.SpecPath(cfg.ID)))
	if err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	if err := bundle.WriteSpec(cfg.StateDir, spec); err != nil {
		return err
	}
	stdio, err := bundle.OpenAgentStdio(cfg.StateDir)
	if err != nil {
		return err
	}
	defer stdio.Close()

	defer func() {
		if retErr != nil {
			cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = d.Delete(cleanupCtx, cfg.ID)
		}
	}()
	opts := &gorunc.CreateOpts{
		IO:         stdio,
		Detach:     true,
		ExtraFiles: []*os.File{cfg.AgentListener},
		PidFile:    filepath.Join(cfg.StateDir, "init.pid"),
	}
	if _, err := d.runc.Run(ctx, cfg.ID, cfg.StateDir, opts); err != nil {
		return runtime.AsMountError(fmt.Errorf("runc run %s: %w: %v: %s", cfg.ID, errdefs.ErrInternal, err, stdio.Tail(2048)))
	}
	return nil
}

// Delete kills the sandbox with SIGKILL and removes its runc state and
// cgroups. An unknown id is not an error.
//
// It kills every process of the sandbox's cgroup directly (thawing a frozen
// one so the kills land), waits until the cgroup is empty and then runs a
// plain `runc delete`: `runc delete --force` on a live container sleeps
// 100 ms before it looks again, which would double the cost of a destroy.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	if err := d.cg.Kill(ctx, id); err != nil {
		return err
	}
	// Every process is gone: what runc delete would remove, without the
	// CLI (about 50 ms of a destroy here), when the state proves it.
	if err := d.deleteStopped(id); err == nil {
		d.freezeMu.Delete(id)
		return nil
	} else if !errors.Is(err, errNotStopped) {
		return err
	}
	err := d.runc.Delete(ctx, id, &gorunc.DeleteOpts{})
	if err != nil && !isNotExist(err) {
		// Not stopped after all (or runc disagrees): let runc force it.
		if ferr := d.runc.Delete(ctx, id, &gorunc.DeleteOpts{Force: true}); ferr != nil && !isNotExist(ferr) {
			return fmt.Errorf("runc delete %s: %w", id, ferr)
		}
	}
	// runc removes the cgroups it made; make sure, as a leftover cgroup
	// directory would pin its limits forever.
	if err := d.cg.RemoveDirs(id); err != nil {
		return fmt.Errorf("remove cgroups of %s: %w", id, err)
	}
	d.freezeMu.Delete(id)
	return nil
}

// Status asks runc for the container's state.
func (d *Driver) Status(ctx context.Context, id string) (runtime.Status, error) {
	if !runtime.ValidID(id) {
		return runtime.StatusUnknown, nil
	}
	c, err := d.runc.State(ctx, id)
	if err != nil {
		if isNotExist(err) {
			return runtime.StatusUnknown, nil
		}
		return "", fmt.Errorf("runc state %s: %w", id, err)
	}
	switch c.Status {
	case "running", "created":
		return runtime.StatusRunning, nil
	case "paused", "pausing":
		return runtime.StatusPaused, nil
	default:
		return runtime.StatusStopped, nil
	}
}

// List returns the ids runc has state for under its root.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	cs, err := d.runc.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("runc list: %w", err)
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// Stats reads cpuacct.usage, memory.usage_in_bytes,
// memory.max_usage_in_bytes, pids.current and the oom_kill counter
// (cgroupv1.Cgroups.Stats). ErrNotFound for an unknown sandbox.
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	return d.cg.Stats(id)
}

var _ runtime.Sampler = (*Driver)(nil)

var _ runtime.OOMCounter = (*Driver)(nil)

// OOMKills reads the oom_kill count of the sandbox's memory cgroup
// (runtime.OOMCounter): one file. ErrNotFound when the id is invalid or
// the sandbox has no cgroup.
func (d *Driver) OOMKills(ctx context.Context, id string) (int64, error) {
	n, err := d.cg.OOMKills(id)
	if err != nil {
		return 0, errdefs.Newf(errdefs.ErrNotFound, "cgroup of sandbox %q: %v", id, err)
	}
	return n, nil
}

// Sample reads the sandbox's CPU time and tasks from its cgroups for the
// host monitor (runtime.Sampler): fewer files than Stats.
func (d *Driver) Sample(ctx context.Context, id string) (runtime.Stats, error) {
	return d.cg.Sample(id)
}

// KillProcessGroup freezes the sandbox, signals every process whose
// in-sandbox process group is pgid, and thaws it again (unless it was
// already paused). Freezing first means no process can fork away while the
// group is being walked. Pause and Resume of the same sandbox wait for it
// (and it for them), so a pause is never undone by the kill's thaw.
func (d *Driver) KillProcessGroup(ctx context.Context, id string, pgid int, sig int) (int, error) {
	if !runtime.ValidID(id) || pgid <= 1 {
		return 0, errdefs.InvalidField("pgid", "must name a process group other than the agent's")
	}
	defer d.freezer(id)()
	prev, err := d.cg.FreezerState(id)
	if err != nil {
		return 0, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	if prev == cgroupv1.Thawed {
		if err := d.cg.SetFreezer(id, cgroupv1.Frozen); err != nil {
			return 0, err
		}
		defer func() { _ = d.cg.SetFreezer(id, cgroupv1.Thawed) }()
	}
	pids, err := d.cg.Procs(id)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, hostPid := range pids {
		g, err := nsPgid(hostPid)
		if err != nil || g != pgid {
			continue
		}
		if err := syscall.Kill(hostPid, syscall.Signal(sig)); err == nil {
			n++
		}
	}
	return n, nil
}

// Pause freezes the sandbox through the freezer cgroup.
func (d *Driver) Pause(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	defer d.freezer(id)()
	return d.cg.SetFreezer(id, cgroupv1.Frozen)
}

// Resume thaws the sandbox.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	defer d.freezer(id)()
	return d.cg.SetFreezer(id, cgroupv1.Thawed)
}

// isNotExist reports whether a runc CLI error says the container is unknown.
func isNotExist(err error) bool {
	s := err.Error()
	return strings.Contains(s, "does not exist") || strings.Contains(s, "not found")
}

// Checkpoint is unavailable: CRIU does not work on this kernel (see the
// design notes), so the runc tier has no memory snapshots.
func (d *Driver) Checkpoint(ctx context.Context, id, dir string) error {
	return fmt.Errorf("runc memory checkpoint: %w", errdefs.ErrUnavailable)
}

// Restore is unavailable, as Checkpoint.
func (d *Driver) Restore(ctx context.Context, cfg runtime.Config, dir string) error {
	return fmt.Errorf("runc memory restore: %w", errdefs.ErrUnavailable)
}
