package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// The core's side of snapshots, fork and memory checkpoints (package
// snapshot): it finds and holds a live sandbox, freezes and thaws it,
// prepares its agent for a checkpoint and brings it back (SnapshotCore),
// and reaches the snapshots through SnapshotHooks, which package snapshot
// implements.

// SnapshotHooks is what the lifecycle core asks of the snapshots. The
// composition sets it with UseSnapshots; without it no snapshot resolves.
type SnapshotHooks interface {
	// Resolve finds the snapshot ref names for ctx's caller (an id, or
	// the newest with that name); ErrNotFound when there is none.
	Resolve(ctx context.Context, ref string) (*node.Snapshot, error)
	// OpenMemory verifies and decrypts sn's memory checkpoint (shared by
	// the restores of one fork) and returns its directory, the handshake
	// generation its agents wait for and a release function.
	OpenMemory(sn *node.Snapshot) (dir string, gen uint64, release func(), err error)
	// SourceNetwork returns the egress policy of the session memory
	// snapshot sn was taken of (nil for none): a restore gets the same
	// network shape. The session may be another host's (a snapshot
	// imported from the fleet). ErrNotFound when it is not known.
	SourceNetwork(ctx context.Context, sn *node.Snapshot) (*node.Network, error)
	// Reconcile removes snapshot files the database does not know and
	// reclaims interrupted forks' snapshots, at start-up after the
	// sessions are reconciled.
	Reconcile(ctx context.Context)
	// CollectExpired deletes expired snapshots nothing depends on (the
	// janitor calls it).
	CollectExpired(ctx context.Context)
}

// noSnapshots is the SnapshotHooks of a core without snapshots.
type noSnapshots struct{}

func (noSnapshots) Resolve(_ context.Context, ref string) (*node.Snapshot, error) {
	return nil, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", ref)
}
func (noSnapshots) OpenMemory(sn *node.Snapshot) (string, uint64, func(), error) {
	return "", 0, nil, fmt.Errorf("memory snapshots: %w", errdefs.ErrUnavailable)
}
func (noSnapshots) SourceNetwork(_ context.Context, sn *node.Snapshot) (*node.Network, error) {
	return nil, errdefs.Newf(errdefs.ErrNotFound, "the session of snapshot %s", sn.ID)
}
func (noSnapshots) Reconcile(context.Context)      {}
func (noSnapshots) CollectExpired(context.Context) {}

var _ SnapshotHooks = noSnapshots{}

// UseSnapshots makes s the snapshots creates start from. Call it once,
// before Recover.
func (m *Manager) UseSnapshots(s SnapshotHooks) { m.snaps = s }

// SnapshotCore returns the core as the snapshots need it (snapshot.Core).
func (m *Manager) SnapshotCore() *SnapshotCore { return &SnapshotCore{m: m} }

// SnapshotCore finds and holds sandboxes and creates sessions for package
// snapshot. It is safe for concurrent use.
type SnapshotCore struct{ m *Manager }

// Get returns session id's record for ctx's caller (Manager.Get).
func (c *SnapshotCore) Get(ctx context.Context, id string) (*node.Session, error) {
	return c.m.Get(ctx, id)
}

// CreateVerified creates a session from spec.Snapshot, whose integrity
// the caller has checked (a fork checks once for all its sessions).
func (c *SnapshotCore) CreateVerified(ctx context.Context, spec node.CreateSpec) (*node.Session, error) {
	rec, _, err := c.m.create(ctx, spec, "", false)
	return rec, err
}

// Destroy ends session id (Manager.Destroy).
func (c *SnapshotCore) Destroy(ctx context.Context, id string) error { return c.m.Destroy(ctx, id) }

// CheckCreate applies the create defaults and bounds to spec and picks its
// driver, as a create would; ErrInvalidArgument naming the field.
func (c *SnapshotCore) CheckCreate(spec *node.CreateSpec) error {
	if err := normalizeCreate(spec, c.m.opts.Limits); err != nil {
		return err
	}
	return c.m.runtimes.pickDriver(spec)
}

// TemplateUsable reports whether template name exists for ctx's caller.
func (c *SnapshotCore) TemplateUsable(ctx context.Context, name string) bool {
	return c.m.tpls.TemplateUsable(ctx, name)
}

// ReserveQuota admits one more of what for tenant (Tenants.ReserveQuota).
func (c *SnapshotCore) ReserveQuota(ctx context.Context, tenant, what string, count func() (int, error)) (func(), error) {
	return c.m.tenants.ReserveQuota(ctx, tenant, what, count)
}

// Find returns live session id (running or paused) of ctx's caller for a
// snapshot: ErrNotFound for an unknown one, ErrTerminated for one that
// ended, ErrConflict for one being created or torn down.
func (c *SnapshotCore) Find(ctx context.Context, id string) (*HeldSandbox, error) {
	sb, err := c.m.pausable(ctx, id)
	if err != nil {
		return nil, err
	}
	return &HeldSandbox{m: c.m, sb: sb}, nil
}

// HeldSandbox is one live sandbox a snapshot works on.
type HeldSandbox struct {
	m  *Manager
	sb *Sandbox
}

// Lock keeps pause, resume and other snapshots of the sandbox out until
// Unlock.
func (h *HeldSandbox) Lock() { h.sb.lifeMu.Lock() }

// Unlock ends Lock.
func (h *HeldSandbox) Unlock() { h.sb.lifeMu.Unlock() }

// Record returns a copy of the sandbox's current record.
func (h *HeldSandbox) Record() node.Session { return h.sb.Record() }

// Driver returns the isolation driver the sandbox runs on.
func (h *HeldSandbox) Driver() runtime.Driver { return h.m.runtimes.driverOf(h.sb) }

// PrepareCheckpoint asks the sandbox's agent to close its socket and its
// connections for a checkpoint of handshake generation gen, and waits
// (up to 5 s) until it has. The exec streams it cuts end with a clear
// error. ErrUnavailable when the agent does not comply (it is then told
// to listen again).
func (h *HeldSandbox) PrepareCheckpoint(ctx context.Context, gen uint64) error {
	sb := h.sb
	// A resume file left from before (generation 0, written when a
	// restarted daemon adopted the sandbox) would end the prepare at once.
	if err := os.Remove(filepath.Join(sb.dir, "ctl", runtime.ControlFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// The prepared agent closes every connection: the exec streams it cuts
	// end with a clear error (streamCut), not a protocol one.
	sb.streamCuts.Add(1)
	if err := sb.agent.PrepareCheckpoint(ctx, gen); err != nil {
		return err
	}
	sb.agent.Close()
	// The agent unlinks its socket when it has closed it (looked at
	// without following a link the sandbox may have put there).
	sockFile, err := guest.SocketFile(sb.agent.Socket())
	if err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Lstat(sockFile); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			h.ResumeAfterCheckpoint(ctx, gen)
			return fmt.Errorf("prepare agent for a checkpoint: %w: it still listens", errdefs.ErrUnavailable)
		}
		time.Sleep(time.Millisecond)
	}
}

// ResumeAfterCheckpoint lets the agent prepared for generation gen listen
// again (its control file, with the sandbox's own hostname) and waits up
// to 10 s until it answers; failures are logged (the session's next call
// reports them).
func (h *HeldSandbox) ResumeAfterCheckpoint(ctx context.Context, gen uint64) {
	sb := h.sb
	if err := writeResume(filepath.Join(sb.dir, "ctl"), wire.ResumeFile{Generation: gen, Hostname: sb.id}); err != nil {
		h.m.log.Error("write resume file", "session", sb.id, "err", err)
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := sb.agent.WaitReady(rctx); err != nil {
		h.m.log.Error("agent did not come back after a checkpoint", "session", sb.id, "err", err)
	}
}

// writeResume writes rf as dir's control file (atomically: the agent
// polls it), creating dir readable by the sandbox.
func writeResume(dir string, rf wire.ResumeFile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.Marshal(rf)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+runtime.ControlFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, runtime.ControlFile))
}
