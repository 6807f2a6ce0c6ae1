package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// Snapshots capture a session's files (the writable layer, not processes
// or memory: the runc tier has no memory checkpoints) as a read-only
// snapshot that new sessions start from. A snapshot of a session that was
// itself restored from snapshot S has S as parent and stores only what
// changed since S.

// maxForks bounds one fork request.
const maxForks = 64

// maxSnapshotName is the longest snapshot name, in bytes.
const maxSnapshotName = 128

// validSnapshotName reports whether name can name a snapshot: 1 to
// maxSnapshotName bytes of printable ASCII without spaces, and not shaped
// like a snapshot id (so that a reference is never ambiguous). E2B names
// look like "team/name:tag".
func validSnapshotName(name string) bool {
	if name == "" || len(name) > maxSnapshotName || validID(name) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' {
			return false
		}
	}
	return true
}

// resolveSnapshot finds the snapshot ref names: an id, or else a name (the
// newest snapshot with it). ErrNotFound when there is none.
func (m *Manager) resolveSnapshot(ctx context.Context, ref string) (*node.Snapshot, error) {
	if validID(ref) {
		sn, err := m.opts.Store.GetSnapshot(ctx, ref)
		if err == nil && !tenancy.Owns(ctx, sn.Tenant) {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", ref)
		}
		return sn, err
	}
	if !validSnapshotName(ref) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", ref)
	}
	return m.opts.Store.GetSnapshotByName(ctx, tenancy.TenantOf(ctx, store.DefaultTenant), ref)
}

// Snapshot captures session id's files. Their pending writes are flushed
// to disk first, while the sandbox runs; then the sandbox is frozen only
// until the storage driver has captured them (a paused one stays paused),
// not while the snapshot is digested, and then keeps running;
// because no process runs during the copy, every write is either wholly in
// the snapshot or not at all (an application that rewrites a file in place
// with several writes can be caught between them, as after a crash; write
// to a temporary file and rename it). ErrInvalidArgument for bad opts.
func (m *Manager) Snapshot(ctx context.Context, id string, opts node.SnapshotOptions) (*node.Snapshot, error) {
	return m.snapshot(ctx, id, opts, false)
}

// snapshot is Snapshot; provisional records the snapshot as provisional
// (ForkSession's, until its forks answer; see reclaimForks).
func (m *Manager) snapshot(ctx context.Context, id string, opts node.SnapshotOptions, provisional bool) (*node.Snapshot, error) {
	if opts.ExpiresIn < 0 {
		return nil, errdefs.InvalidField("expires_in_s", "must not be negative")
	}
	if opts.Name != "" && !validSnapshotName(opts.Name) {
		return nil, errdefs.InvalidField("name", "must be 1-%d printable characters, not a snapshot id", maxSnapshotName)
	}
	if opts.Name != "" && m.TemplateUsable(ctx, opts.Name) {
		// E2B creates name templates and snapshots in one field.
		return nil, errdefs.InvalidField("name", "%q is a template's name", opts.Name)
	}
	sb, err := m.pausable(ctx, id)
	if err != nil {
		return nil, err
	}
	tenant := sb.Record().Tenant
	release, err := m.ReserveQuota(ctx, tenant, "snapshots", func() (int, error) { return m.tenantSnapshots(ctx, tenant) })
	if err != nil {
		return nil, err
	}
	defer release()
	sb.lifeMu.Lock()
	defer sb.lifeMu.Unlock()
	rec := sb.Record()
	if !isLive(rec.State) {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, rec.State)
	}
	snapID := newID()
	began := time.Now()
	// Write what the sandbox wrote without syncing while it still runs, so
	// the freeze below covers only what it writes from now on (a large
	// unsynced write used to be flushed inside the freeze: 587 ms for
	// 300 MB). A failure only costs that.
	if err := m.opts.Storage.Flush(ctx, id); err != nil {
		m.log.Warn("flush before snapshot", "session", id, "err", err)
	}
	flushed := time.Now()
	var mem *memoryCapture
	if opts.Memory {
		if mem, err = m.prepareMemory(ctx, sb, rec, snapID); err != nil {
			return nil, err
		}
	}
	thaw := func() {}
	if rec.State == node.StateRunning {
		if err := m.driverOf(sb).Pause(ctx, id); err != nil {
			if mem != nil {
				mem.resume(ctx, m)
				os.RemoveAll(mem.dir)
			}
			return nil, fmt.Errorf("freeze for snapshot: %w", err)
		}
		// Thawed as soon as the driver has captured the files (the digest
		// walk over every file comes after), or when it returns. A memory
		// checkpoint is taken while the sandbox is still frozen, so that
		// it and the files agree.
		thaw = sync.OnceFunc(func() {
			if mem != nil {
				mem.checkpoint(ctx)
			}
			if rerr := m.driverOf(sb).Resume(context.WithoutCancel(ctx), id); rerr != nil {
				m.log.Error("thaw after snapshot", "session", id, "err", rerr)
			}
			if mem != nil {
				mem.resume(ctx, m)
			}
		})
	}
	prepared := time.Now()
	info, err := m.opts.Storage.Snapshot(ctx, id, snapID, thaw)
	thaw()
	captured := time.Now()
	if err == nil && mem != nil && mem.err != nil {
		_ = m.opts.Storage.RemoveSnapshot(context.WithoutCancel(ctx), snapID)
		err = mem.err
	}
	if err != nil {
		if mem != nil {
			os.RemoveAll(mem.dir)
		}
		return nil, fmt.Errorf("snapshot of %s: %w", id, err)
	}
	sn := &node.Snapshot{
		ID: snapID, SessionID: id, Parent: info.Parent, Template: info.Template, Storage: m.opts.Storage.Name(),
		SizeBytes: info.SizeBytes, Digest: info.Digest, CreatedAt: info.CreatedAt.UTC(), Name: opts.Name,
		Tenant: rec.Tenant, Provisional: provisional,
	}
	if mem != nil {
		if err := m.sealMemory(mem, sn); err != nil {
			_ = m.opts.Storage.RemoveSnapshot(context.WithoutCancel(ctx), snapID)
			return nil, err
		}
	}
	if opts.ExpiresIn > 0 {
		sn.ExpiresAt = sn.CreatedAt.Add(opts.ExpiresIn)
	}
	if err := m.opts.Store.CreateSnapshot(ctx, sn); err != nil {
		_ = m.opts.Storage.RemoveSnapshot(context.WithoutCancel(ctx), snapID)
		os.RemoveAll(m.memoryDir(snapID))
		return nil, err
	}
	m.log.Info("snapshot taken", "session", id, "snapshot", snapID, "parent", sn.Parent, "bytes", sn.SizeBytes,
		"memory_bytes", sn.MemoryBytes, "flush_ms", ms(flushed.Sub(began)), "prepare_ms", ms(prepared.Sub(flushed)),
		"capture_ms", ms(captured.Sub(prepared)),
		"store_ms", ms(time.Since(captured)))
	if mem != nil {
		m.log.Debug("memory snapshot", "snapshot", snapID, "checkpoint_ms", ms(mem.checkpointTime), "agent_back_ms", ms(mem.resumeTime))
	}
	return sn, nil
}

// Fork starts count sessions from snapshot snapID, each as req would create
// it (req.Snapshot and req.Template must be empty). The snapshot's
// integrity is checked once. All or nothing: when one session fails, the
// others are destroyed and the error returned.
func (m *Manager) Fork(ctx context.Context, snapID string, count int, req node.CreateSpec) ([]*node.Session, error) {
	if count < 1 || count > maxForks {
		return nil, errdefs.InvalidField("count", "must be between 1 and %d", maxForks)
	}
	if req.Snapshot != "" || req.Template != "" {
		return nil, errdefs.InvalidField("template", "a fork starts from the snapshot; template and snapshot cannot be set")
	}
	sn, err := m.resolveSnapshot(ctx, snapID)
	if err != nil {
		return nil, err
	}
	snapID = sn.ID
	if err := m.opts.Storage.Verify(ctx, snapID); err != nil {
		return nil, err
	}
	req.Snapshot = snapID
	out := make([]*node.Session, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := 0; i < count; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			out[i], _, errs[i] = m.create(ctx, req, "", false)
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, rec := range out {
			if rec != nil {
				_ = m.Destroy(context.WithoutCancel(ctx), rec.ID)
			}
		}
		return nil, firstError(errs)
	}
	return out, nil
}

// firstError returns the first non-nil error (its class decides the answer).
func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ForkSession snapshots session id (with opts) and starts count sessions
// from the snapshot (which stays, so more can be forked later; with
// opts.ExpiresIn it is collected once expired and unused). Settings req
// leaves unset are the source session's.
func (m *Manager) ForkSession(ctx context.Context, id string, count int, req node.CreateSpec, opts node.SnapshotOptions) (*node.Snapshot, []*node.Session, error) {
	if count < 1 || count > maxForks {
		return nil, nil, errdefs.InvalidField("count", "must be between 1 and %d", maxForks)
	}
	src, err := m.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	// Refuse a request the forks would refuse before taking the snapshot.
	check := inherit(*src, req)
	if err := normalizeCreate(&check, m.opts.Limits); err != nil {
		return nil, nil, err
	}
	if err := m.pickDriver(&check); err != nil {
		return nil, nil, err
	}
	if opts.Memory && check.Isolation != src.Driver {
		return nil, nil, errdefs.InvalidField("isolation", "forks of a memory snapshot run on the session's own driver, %q", src.Driver)
	}
	// The snapshot stays provisional until the forks are made: a daemon
	// that stops in between (a crash; nobody learned the snapshot's id)
	// leaves it for the next start to reclaim (reclaimForks).
	sn, err := m.snapshot(ctx, id, opts, true)
	if err != nil {
		return nil, nil, err
	}
	sessions, err := m.Fork(ctx, sn.ID, count, inherit(*src, req))
	if err != nil {
		// The snapshot was made for these forks only (a refusal at the
		// tenant's limit must not leave snapshots behind).
		if derr := m.DeleteSnapshot(context.WithoutCancel(ctx), sn.ID, true); derr != nil {
			m.log.Warn("delete the snapshot of a failed fork", "snapshot", sn.ID, "err", derr)
		}
		return nil, nil, err
	}
	if err := m.opts.Store.KeepSnapshot(context.WithoutCancel(ctx), sn.ID); err != nil {
		// The forks run; a restart now would give the snapshot an expiry
		// rather than delete it (its sessions use it).
		m.log.Warn("keep the snapshot of a fork", "snapshot", sn.ID, "err", err)
	}
	sn.Provisional = false
	return sn, sessions, nil
}

// reclaimForks deals, at start-up, with the snapshots of forks a previous
// daemon did not finish (it stopped between the snapshot and the fork's
// answer, so their caller never learned their ids and nothing would ever
// delete them; they counted against the tenant's max_snapshots). One that
// nothing uses is deleted; one whose forked sessions still run (adopted)
// or that has child snapshots is made to expire now, so the janitor
// deletes it once they are gone. Run it after the sessions are reconciled.
func (m *Manager) reclaimForks(ctx context.Context) {
	snaps, err := m.opts.Store.ListSnapshots(ctx)
	if err != nil {
		m.log.Warn("list snapshots to reclaim interrupted forks", "err", err)
		return
	}
	for _, sn := range snaps {
		if !sn.Provisional {
			continue
		}
		err := m.DeleteSnapshot(ctx, sn.ID, false)
		switch {
		case err == nil:
			m.log.Info("deleted the snapshot of a fork the daemon did not finish", "snapshot", sn.ID, "tenant", sn.Tenant)
			m.opts.Audit.Record(ctx, audit.Event{Tenant: sn.Tenant, Session: sn.SessionID, Kind: "snapshot.expire",
				Detail: map[string]any{"snapshot": sn.ID, "reason": "interrupted fork"}})
		case errors.Is(err, errdefs.ErrConflict):
			if err := m.opts.Store.ExpireSnapshot(ctx, sn.ID, time.Now()); err != nil {
				m.log.Warn("expire the snapshot of an interrupted fork", "snapshot", sn.ID, "err", err)
			} else {
				m.log.Info("the snapshot of a fork the daemon did not finish expires once unused", "snapshot", sn.ID)
			}
		default:
			m.log.Warn("delete the snapshot of an interrupted fork", "snapshot", sn.ID, "err", err)
		}
	}
}

// inherit fills req's unset fields from rec.
func inherit(rec node.Session, req node.CreateSpec) node.CreateSpec {
	if req.CPU == 0 {
		req.CPU = rec.CPU
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = rec.MemoryMB
	}
	if req.Pids == 0 {
		req.Pids = rec.Pids
	}
	if req.TimeoutS == 0 {
		req.TimeoutS = rec.TimeoutS
	}
	if req.DiskMB == 0 {
		req.DiskMB = rec.DiskMB
	}
	if req.User == "" {
		req.User = rec.DefaultUser
	}
	if req.Workdir == "" {
		req.Workdir = rec.Workdir
	}
	if req.Env == nil {
		req.Env = rec.Env
	}
	if req.Network == nil {
		req.Network = copyNetwork(rec.Network)
	}
	if req.Metadata == nil {
		req.Metadata = rec.Metadata
	}
	if req.OnTimeout == "" {
		req.OnTimeout, req.AutoResume = rec.OnTimeout, rec.AutoResume
	}
	if req.Isolation == "" {
		req.Isolation = rec.Driver
	}
	return req
}

// GetSnapshot returns the snapshot ref names (its id, or a name: the
// newest snapshot with it); ErrNotFound when absent.
func (m *Manager) GetSnapshot(ctx context.Context, id string) (*node.Snapshot, error) {
	return m.resolveSnapshot(ctx, id)
}

// tenantSnapshots counts tenant's snapshots.
func (m *Manager) tenantSnapshots(ctx context.Context, tenant string) (int, error) {
	all, err := m.opts.Store.ListSnapshots(ctx)
	n := 0
	for _, sn := range all {
		if sn.Tenant == tenant {
			n++
		}
	}
	return n, err
}

// ListSnapshots returns every snapshot the caller can see (its tenant's),
// newest first.
func (m *Manager) ListSnapshots(ctx context.Context) ([]*node.Snapshot, error) {
	all, err := m.opts.Store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, sn := range all {
		if tenancy.Owns(ctx, sn.Tenant) {
			out = append(out, sn)
		}
	}
	return out, nil
}

// DeleteSnapshot deletes snapshot id. While child snapshots or live
// sessions depend on it, it is ErrConflict naming them, unless force: then
// the dependent sessions are destroyed and the child snapshots deleted
// (recursively, with force) first. Deleting a missing snapshot is
// ErrNotFound.
func (m *Manager) DeleteSnapshot(ctx context.Context, id string, force bool) error {
	sn, err := m.opts.Store.GetSnapshot(ctx, id)
	if err != nil {
		return err
	}
	if !tenancy.Owns(ctx, sn.Tenant) {
		return errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", id)
	}
	children, sessions, err := m.opts.Store.SnapshotDependents(ctx, id)
	if err != nil {
		return err
	}
	if len(children)+len(sessions) > 0 && !force {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot %s is used by %s; delete those first or force",
			id, dependents(children, sessions))
	}
	for _, sid := range sessions {
		if err := m.Destroy(ctx, sid); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("destroy session %s that uses snapshot %s: %w", sid, id, err)
		}
	}
	for _, child := range children {
		if err := m.DeleteSnapshot(ctx, child, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	if err := m.opts.Storage.RemoveSnapshot(ctx, id); err != nil {
		return err
	}
	if err := os.RemoveAll(m.memoryDir(id)); err != nil {
		return err
	}
	return m.opts.Store.DeleteSnapshot(ctx, id)
}

func dependents(children, sessions []string) string {
	var parts []string
	if len(children) > 0 {
		parts = append(parts, "snapshots "+strings.Join(children, ", "))
	}
	if len(sessions) > 0 {
		parts = append(parts, "sessions "+strings.Join(sessions, ", "))
	}
	return strings.Join(parts, " and ")
}

// collectSnapshots deletes expired snapshots nothing depends on; the ones
// still used wait for a later round.
func (m *Manager) collectSnapshots(ctx context.Context) {
	snaps, err := m.opts.Store.ListSnapshots(ctx)
	if err != nil {
		m.log.Warn("list snapshots for collection", "err", err)
		return
	}
	now := time.Now()
	for _, sn := range snaps {
		if sn.ExpiresAt.IsZero() || now.Before(sn.ExpiresAt) {
			continue
		}
		err := m.DeleteSnapshot(ctx, sn.ID, false)
		switch {
		case err == nil:
			m.log.Info("expired snapshot deleted", "snapshot", sn.ID, "tenant", sn.Tenant)
			m.opts.Audit.Record(ctx, audit.Event{Tenant: sn.Tenant, Session: sn.SessionID, Kind: "snapshot.expire",
				Detail: map[string]any{"snapshot": sn.ID}})
		case errors.Is(err, errdefs.ErrConflict):
			m.log.Debug("expired snapshot still used", "snapshot", sn.ID, "err", err)
		default:
			m.log.Warn("delete expired snapshot", "snapshot", sn.ID, "err", err)
		}
	}
}
