// Package snapshot takes snapshots of sessions, forks sessions from them
// and keeps their chains: a snapshot captures a session's files (the
// writable layer; with a memory_snapshot driver also its processes and
// memory, memory.go) as a read-only snapshot that new sessions start from.
// A snapshot of a session that was itself restored from snapshot S has S as
// parent and stores only what changed since S. Deleting a snapshot that
// child snapshots or live sessions depend on is refused unless forced;
// expired ones are collected once unused; the snapshot of a fork a daemon
// did not finish is reclaimed at the next start.
//
// The package depends on the lifecycle core through Core (find and hold a
// live sandbox, freeze and thaw it, create and destroy sessions), and on
// the storage driver and the store directly. The core reaches it through
// the methods Resolve, OpenMemory, Reconcile and CollectExpired, which it
// declares as an interface of its own (sandbox.SnapshotHooks); only the
// composition imports both.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
	"github.com/forkbox/forkbox/volume"
)

// Core is what snapshots need of the lifecycle core. Its methods are safe
// for concurrent use; every one is scoped to ctx's caller (tenancy).
type Core interface {
	// Find returns live session id (running or paused) for a snapshot:
	// ErrNotFound when unknown, ErrTerminated when it ended, ErrConflict
	// while it is created or torn down.
	Find(ctx context.Context, id string) (Held, error)
	// Get returns session id's record (also once it ended).
	Get(ctx context.Context, id string) (*node.Session, error)
	// CreateVerified creates a session from spec.Snapshot, whose
	// integrity the caller has checked.
	CreateVerified(ctx context.Context, spec node.CreateSpec) (*node.Session, error)
	// Destroy ends session id.
	Destroy(ctx context.Context, id string) error
	// CheckCreate normalizes spec and picks its driver as a create would;
	// ErrInvalidArgument naming the field.
	CheckCreate(spec *node.CreateSpec) error
	// TemplateUsable reports whether template name exists for the caller.
	TemplateUsable(ctx context.Context, name string) bool
	// ReserveQuota admits one more of what for tenant against its policy
	// (count counts what exists); release undoes it.
	ReserveQuota(ctx context.Context, tenant, what string, count func() (int, error)) (release func(), err error)
	// Exec runs spec in live session id as the API's exec does (fork and
	// run).
	Exec(ctx context.Context, id string, spec node.ExecSpec, out node.Output) (*node.ExecResult, error)
}

// Held is one live sandbox a snapshot works on.
type Held interface {
	// Lock keeps pause, resume and other snapshots of it out until Unlock.
	Lock()
	Unlock()
	// Record returns a copy of its current record.
	Record() node.Session
	// Driver returns the isolation driver it runs on (Pause freezes it,
	// Resume thaws it, Checkpoint saves its memory).
	Driver() runtime.Driver
	// PrepareCheckpoint makes its agent close its host socket for a
	// checkpoint of handshake generation gen; ErrUnavailable when the
	// agent does not comply.
	PrepareCheckpoint(ctx context.Context, gen uint64) error
	// ResumeAfterCheckpoint makes the prepared agent listen again and
	// waits for it.
	ResumeAfterCheckpoint(ctx context.Context, gen uint64)
}

// Options configure a Service.
type Options struct {
	// Core finds sandboxes and creates sessions.
	Core Core
	// Store keeps the snapshot records.
	Store *store.Store
	// Storage holds the snapshots' files.
	Storage storage.Driver
	// Layout places memory checkpoints (sealed) and their scratch.
	Layout datadir.Layout
	// Key seals memory checkpoints at rest; nil: no memory snapshots.
	Key *seal.Key
	// Audit records expiries; nil records nothing.
	Audit *audit.Recorder
	// Log is where the service logs; nil: slog.Default().
	Log *slog.Logger
	// ImageCacheBytes bounds the decrypted memory checkpoints kept for
	// later restores (images.go), in bytes; 0 or less keeps none.
	ImageCacheBytes int64
	// Replicas, when set, receives a copy of every sealed memory
	// checkpoint once its snapshot is recorded (replicate.go).
	Replicas Replicas
	// Volumes, when set, snapshots the volumes a session mounts with its
	// files, and is told when a snapshot goes; nil: sessions have none.
	Volumes *volume.Service
}

// Service keeps one host's snapshots. It is safe for concurrent use.
type Service struct {
	core    Core
	store   *store.Store
	storage storage.Driver
	layout  datadir.Layout
	key     *seal.Key
	audit   *audit.Recorder
	log     *slog.Logger
	volumes *volume.Service

	// images are memory checkpoints decrypted for restores, in progress
	// or kept for later ones within cacheBytes, by snapshot id (images.go).
	imgMu      sync.Mutex
	images     map[string]*openImage
	cacheBytes int64
	copying    int64 // bytes reserved for copies written while sealing (sealing.go)

	// seals are the memory checkpoints being sealed after their snapshot
	// call answered, by snapshot id; seal counts them (sealing.go).
	sealMu sync.Mutex
	seals  map[string]*pendingSeal
	seal   sync.WaitGroup
	// sealClosed is set (under sealMu) once Close waits for seal.
	sealClosed bool

	// replicas and the background copies to them (replicate.go).
	replicas Replicas
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup
	// importing holds one token: imports of other hosts' snapshots run
	// one at a time, and a caller waiting for its turn can give up
	// (import.go).
	importing chan struct{}
}

// New returns the snapshot service for opts.
func New(opts Options) *Service {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	cache := max(opts.ImageCacheBytes, 0)
	bgCtx, bgCancel := context.WithCancel(context.Background())
	return &Service{core: opts.Core, store: opts.Store, storage: opts.Storage, layout: opts.Layout, key: opts.Key,
		audit: opts.Audit, log: log, images: map[string]*openImage{}, cacheBytes: cache, seals: map[string]*pendingSeal{},
		replicas: opts.Replicas, bgCtx: bgCtx, bgCancel: bgCancel, volumes: opts.Volumes, importing: make(chan struct{}, 1)}
}

// Resolve finds the snapshot ref names for ctx's caller: an id, or else a
// name (the newest snapshot with it). An id this host does not have but
// the fleet has a replicated copy of is imported first (import.go), so
// that forks, creates and restores from it work here. ErrNotFound when
// there is none.
func (s *Service) Resolve(ctx context.Context, ref string) (*node.Snapshot, error) {
	sn, err := s.resolveLocal(ctx, ref)
	if errors.Is(err, errdefs.ErrNotFound) && s.replicas != nil && s.key != nil && node.ValidID(ref) {
		return s.importRemote(ctx, ref)
	}
	return sn, err
}

// resolveLocal is Resolve among this host's snapshots only.
func (s *Service) resolveLocal(ctx context.Context, ref string) (*node.Snapshot, error) {
	if node.ValidID(ref) {
		sn, err := s.store.GetSnapshot(ctx, ref)
		if err == nil && !tenancy.Owns(ctx, sn.Tenant) {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", ref)
		}
		return sn, err
	}
	if !node.ValidSnapshotName(ref) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", ref)
	}
	return s.store.GetSnapshotByName(ctx, tenancy.TenantOf(ctx, store.DefaultTenant), ref)
}

// GetSnapshot returns the snapshot ref names (its id, or a name: the
// newest snapshot with it); ErrNotFound when absent.
func (s *Service) GetSnapshot(ctx context.Context, ref string) (*node.Snapshot, error) {
	return s.resolveLocal(ctx, ref)
}

// ListSnapshots returns every snapshot the caller can see (its tenant's),
// newest first.
func (s *Service) ListSnapshots(ctx context.Context) ([]*node.Snapshot, error) {
	all, err := s.store.ListSnapshots(ctx)
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

// tenantSnapshots counts tenant's snapshots, its volumes' own snapshots
// included (store.TenantSnapshotCount; volume.Service.Snapshot reserves
// against the same count).
func (s *Service) tenantSnapshots(ctx context.Context, tenant string) (int, error) {
	return s.store.TenantSnapshotCount(ctx, tenant)
}

// Snapshot captures session id's files. Their pending writes are flushed
// to disk first, while the sandbox runs; then the sandbox is frozen only
// until the storage driver has captured them (a paused one stays paused),
// not while the snapshot is digested, and then keeps running;
// because no process runs during the copy, every write is either wholly in
// the snapshot or not at all (an application that rewrites a file in place
// with several writes can be caught between them, as after a crash; write
// to a temporary file and rename it). ErrInvalidArgument for bad opts.
func (s *Service) Snapshot(ctx context.Context, id string, opts node.SnapshotOptions) (*node.Snapshot, error) {
	return s.take(ctx, id, opts, false)
}

// take is Snapshot; provisional records the snapshot as provisional
// (ForkSession's, until its forks answer; see reclaimForks).
func (s *Service) take(ctx context.Context, id string, opts node.SnapshotOptions, provisional bool) (*node.Snapshot, error) {
	if opts.ExpiresIn < 0 {
		return nil, errdefs.InvalidField("expires_in_s", "must not be negative")
	}
	if opts.Name != "" && !node.ValidSnapshotName(opts.Name) {
		return nil, errdefs.InvalidField("name", "must be 1-%d printable characters, not a snapshot id", node.MaxSnapshotName)
	}
	if opts.Name != "" && s.core.TemplateUsable(ctx, opts.Name) {
		// E2B creates name templates and snapshots in one field.
		return nil, errdefs.InvalidField("name", "%q is a template's name", opts.Name)
	}
	sb, err := s.core.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	tenant := sb.Record().Tenant
	release, err := s.core.ReserveQuota(ctx, tenant, "snapshots", func() (int, error) { return s.tenantSnapshots(ctx, tenant) })
	if err != nil {
		return nil, err
	}
	defer release()
	sb.Lock()
	defer sb.Unlock()
	rec := sb.Record()
	if rec.State != node.StateRunning && rec.State != node.StatePaused {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, rec.State)
	}
	snapID := node.NewID()
	vols, err := s.beginVolumes(ctx, rec, snapID)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	// Write what the sandbox wrote without syncing while it still runs, so
	// the freeze below covers only what it writes from now on (a large
	// unsynced write used to be flushed inside the freeze: 587 ms for
	// 300 MB). A failure only costs that.
	if err := s.storage.Flush(ctx, id); err != nil {
		s.log.Warn("flush before snapshot", "session", id, "err", err)
	}
	flushed := time.Now()
	var mem *memoryCapture
	if opts.Memory {
		if mem, err = s.prepareMemory(ctx, sb, rec, snapID); err != nil {
			return nil, err
		}
	}
	thaw := func() {}
	if rec.State == node.StateRunning {
		if err := sb.Driver().Pause(ctx, id); err != nil {
			if mem != nil {
				mem.resume(ctx)
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
			if rerr := sb.Driver().Resume(context.WithoutCancel(ctx), id); rerr != nil {
				s.log.Error("thaw after snapshot", "session", id, "err", rerr)
			}
			if mem != nil {
				mem.resume(ctx)
			}
		})
	}
	prepared := time.Now()
	// The volumes the session mounts read-write are snapshotted in the
	// same frozen window as its layer, right after it (a subvolume
	// snapshot each), so that they agree with its files.
	var volErr error
	frozen := sync.OnceFunc(func() {
		volErr = vols.Freeze(ctx)
		thaw()
	})
	info, err := s.storage.Snapshot(ctx, id, snapID, frozen)
	if err != nil {
		thaw()
	} else {
		frozen()
	}
	captured := time.Now()
	if err == nil && volErr == nil {
		volErr = vols.Finish(ctx)
	}
	if err == nil && (volErr != nil || mem != nil && mem.err != nil) {
		_ = s.storage.RemoveSnapshot(context.WithoutCancel(ctx), snapID)
		err = volErr
		if err == nil {
			err = mem.err
		}
	}
	if err != nil {
		vols.Abort(ctx)
		if mem != nil {
			os.RemoveAll(mem.dir)
		}
		return nil, fmt.Errorf("snapshot of %s: %w", id, err)
	}
	sn := &node.Snapshot{
		ID: snapID, SessionID: id, Parent: info.Parent, Template: info.Template, Storage: s.storage.Name(),
		SizeBytes: info.SizeBytes, Digest: info.Digest, CreatedAt: info.CreatedAt.UTC(), Name: opts.Name,
		Tenant: rec.Tenant, Provisional: provisional,
	}
	var pending *pendingSeal
	if mem != nil {
		// Sealed after the answer (sealing.go); the size is known now
		// (create checks a restore's memory limit against it).
		n, err := plainBytes(mem.dir)
		if err != nil {
			_ = s.storage.RemoveSnapshot(context.WithoutCancel(ctx), snapID)
			os.RemoveAll(mem.dir)
			vols.Abort(ctx)
			return nil, fmt.Errorf("checkpoint of %s: %w", id, err)
		}
		sn.MemoryDriver, sn.MemoryBytes = mem.driver, n
		pending = s.beginSeal(snapID)
	}
	if opts.ExpiresIn > 0 {
		sn.ExpiresAt = sn.CreatedAt.Add(opts.ExpiresIn)
	}
	if err := s.store.CreateSnapshot(ctx, sn); err != nil {
		_ = s.storage.RemoveSnapshot(context.WithoutCancel(ctx), snapID)
		if mem != nil {
			os.RemoveAll(mem.dir)
			pending.err = err
			s.sealMu.Lock()
			delete(s.seals, snapID)
			s.sealMu.Unlock()
			close(pending.done)
		}
		vols.Abort(ctx)
		return nil, err
	}
	s.log.Info("snapshot taken", "session", id, "snapshot", snapID, "parent", sn.Parent, "bytes", sn.SizeBytes,
		"memory_bytes", sn.MemoryBytes, "flush_ms", ms(flushed.Sub(began)), "prepare_ms", ms(prepared.Sub(flushed)),
		"capture_ms", ms(captured.Sub(prepared)),
		"store_ms", ms(time.Since(captured)))
	if mem != nil {
		s.log.Debug("memory snapshot", "snapshot", snapID, "agent_prepare_ms", ms(prepared.Sub(flushed)),
			"checkpoint_ms", ms(mem.checkpointTime), "agent_back_ms", ms(mem.resumeTime))
		s.sealLater(mem, *sn, pending)
	} else {
		s.replicateFiles(*sn)
	}
	return sn, nil
}

// beginVolumes prepares the capture of the volumes session rec mounts
// with snapshot snapID (nil when it mounts none or there are no volumes).
func (s *Service) beginVolumes(ctx context.Context, rec node.Session, snapID string) (*volume.Capture, error) {
	if s.volumes == nil || len(rec.Volumes) == 0 {
		return nil, nil
	}
	return s.volumes.BeginCapture(ctx, rec.Tenant, snapID, rec.Volumes)
}

// ms is d in milliseconds, for the log.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
