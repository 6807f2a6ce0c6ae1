package sandbox

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// Create starts a new sandbox for req. With a non-empty idempotencyKey, a
// retry of the same request returns the session made by the first one
// (created is then false) and a different request with that key fails with
// ErrConflict. On any failure the half-made sandbox is torn down and its
// record ends as terminated with reason error.
//
// With req.Snapshot the session starts from that snapshot's files (after
// its integrity check); without one, a ready warm-pool member that fits is
// taken when there is one. A session that names no user runs as its
// template's (its image's USER); a new session of a template with a start
// command has it started (runStartCommand), unless it is a build step's.
//
// A retry with the key waits while the first call still runs, its
// template's start command and ready check included (so it never gets a
// session that is not ready yet); a retry of a call whose session failed
// its start command or ready check fails as it did (notStarted).
func (m *Manager) Create(ctx context.Context, req node.CreateSpec, idempotencyKey string) (rec *node.Session, created bool, err error) {
	if idempotencyKey != "" {
		// Keys are per tenant (create stores them as "tenant/key").
		defer m.keyLocks.Lock(callerTenant(ctx) + "/" + idempotencyKey)()
	}
	rec, created, err = m.create(ctx, req, idempotencyKey, true)
	if err == nil && created && !req.BuildStep {
		if err := m.runStartCommand(ctx, rec); err != nil {
			return nil, false, err
		}
	}
	if err == nil && !created {
		if err := notStarted(rec); err != nil {
			return nil, false, err
		}
	}
	return rec, created, err
}

// create is Create; verify=false skips the snapshot integrity check (Fork
// checks once for all its sessions).
func (m *Manager) create(ctx context.Context, req node.CreateSpec, idempotencyKey string, verify bool) (rec *node.Session, created bool, err error) {
	began := time.Now()
	tenant := callerTenant(ctx)
	trec, policy, err := m.adm.Tenant(ctx, tenant)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, false, errdefs.Newf(errdefs.ErrPermissionDenied, "tenant %s no longer exists", tenant)
	}
	if err != nil {
		return nil, false, err
	}
	admission.Defaults(&req, policy, m.opts.Limits)
	userGiven := req.User != ""
	if !userGiven && req.Snapshot == "" {
		req.User = m.templateUser(req.Template)
	}
	if err := normalizeCreate(&req, m.opts.Limits); err != nil {
		return nil, false, err
	}
	// A template that holds its started server in a memory snapshot: a
	// create that fits restores it (runStartCommand then starts nothing).
	if id := m.warmSnapshot(ctx, &req, userGiven); id != "" {
		req.Snapshot = id
	}
	// Resolved once, here: a memory snapshot decides the driver (before
	// the request hash); its errors are reported after the idempotency
	// check below, as for any snapshot.
	var snap *node.Snapshot
	var snapErr error
	if req.Snapshot != "" {
		snap, snapErr = m.snaps.Resolve(ctx, req.Snapshot)
		if snapErr == nil && req.Isolation == "" && snap.MemoryDriver != "" {
			req.Isolation = snap.MemoryDriver
		}
		if u := m.templateUser(snapTemplate(snap, snapErr)); u != "" && !userGiven {
			req.User = u // (a session of the snapshot's template runs as its USER too)
		}
	}
	if err := m.runtimes.pickDriver(&req); err != nil {
		return nil, false, err
	}
	hash := requestHash(&req)
	if idempotencyKey != "" {
		// Keys are per tenant: stored as "tenant/key".
		idempotencyKey = tenant + "/" + idempotencyKey // (locked by Create)
		prev, err := m.opts.Store.GetSessionByIdempotencyKey(ctx, idempotencyKey)
		if err == nil {
			if prev.RequestHash != hash {
				return nil, false, errdefs.Newf(errdefs.ErrConflict,
					"Idempotency-Key %q was used for a different request", strings.TrimPrefix(idempotencyKey, tenant+"/"))
			}
			if sb := m.lookup(prev.ID); sb != nil {
				r := sb.Record()
				return &r, false, nil
			}
			return prev, false, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, false, err
		}
	}

	if req.Snapshot != "" {
		if errors.Is(snapErr, errdefs.ErrNotFound) {
			return nil, false, errdefs.InvalidField("snapshot", "snapshot %q does not exist", req.Snapshot)
		}
		if snapErr != nil {
			return nil, false, snapErr
		}
		req.Snapshot, req.Template = snap.ID, snap.Template
		if len(req.Volumes) == 0 && m.opts.Volumes != nil {
			// The volumes the snapshot captured, as its session mounted
			// them (read-write ones become copies of the session's own).
			if req.Volumes, err = m.opts.Volumes.SnapshotMounts(ctx, snap.ID); err != nil {
				return nil, false, err
			}
		}
		if snap.MemoryDriver != "" && snap.MemoryDriver != req.Isolation {
			return nil, false, errdefs.InvalidField("isolation", "snapshot %s holds memory that only isolation %q can restore",
				snap.ID, snap.MemoryDriver)
		}
		if need := (snap.MemoryBytes + 1<<20 - 1) >> 20; snap.MemoryDriver != "" && req.MemoryMB < need {
			return nil, false, errdefs.InvalidField("memory_mb", "snapshot %s holds %d MiB of memory: give at least that",
				snap.ID, need)
		}
		if snap.MemoryDriver != "" {
			if err := m.memoryNetwork(ctx, snap, &req); err != nil {
				return nil, false, err
			}
		}
	}
	if !m.tpls.templateVisible(ctx, req.Template) {
		return nil, false, errdefs.InvalidField("template", "template %q does not exist", req.Template)
	}
	if err := m.checkSecrets(ctx, tenant, req.Network); err != nil {
		return nil, false, err
	}
	if err := m.adm.Check(ctx, tenant, policy, &req); err != nil {
		return nil, false, err
	}
	ctx, res, err := m.adm.Admit(ctx, trec, policy, req.MemoryMB)
	if err != nil {
		return nil, false, err
	}
	defer func() {
		if err != nil {
			res.Release() // (the failed sandbox's teardown released it already, or nothing took it)
		}
	}()
	path := "cold"
	if req.Snapshot != "" {
		path = "snapshot"
		if verify {
			admitted := time.Now()
			if err := m.opts.Storage.Verify(ctx, snap.ID); err != nil {
				return nil, false, err
			}
			m.log.Debug("snapshot verified", "snapshot", snap.ID, "checks_ms", ms(admitted.Sub(began)),
				"verify_ms", ms(time.Since(admitted)))
		}
	} else if req.Network != nil || len(req.Volumes) > 0 || req.BuildStep {
		// Warm-pool members have no network or volumes (those are given
		// per sandbox) and a read-only root.
	} else if rec, err := m.warm.Claim(ctx, req, idempotencyKey, hash); rec != nil || err != nil {
		if rec != nil {
			m.started(ctx, rec, "pool", began)
		}
		return rec, rec != nil, err
	}
	if (snap == nil || snap.MemoryDriver == "") && !req.BuildStep {
		if rec, err := m.fromSpare(ctx, req, idempotencyKey, hash); rec != nil || err != nil {
			if rec != nil {
				m.started(ctx, rec, "spare", began)
			}
			return rec, rec != nil, err
		}
	}
	rec, err = m.launch(ctx, req, idempotencyKey, hash, node.StateCreating, node.StateRunning)
	if err == nil {
		m.started(ctx, rec, path, began)
	}
	return rec, err == nil, err
}

// started records a session that a create started by path (pool, cold or
// snapshot): its latency, and a "session.start" audit record (whatever
// API or fork asked for it).
func (m *Manager) started(ctx context.Context, rec *node.Session, path string, began time.Time) {
	d := time.Since(began)
	m.opts.Metrics.ObserveCreate(path, d)
	detail := map[string]any{"path": path, "template": rec.Template, "driver": rec.Driver, "cpu": rec.CPU,
		"memory_mb": rec.MemoryMB, "disk_mb": rec.DiskMB, "ms": d.Milliseconds()}
	if rec.Snapshot != "" {
		detail["snapshot"] = rec.Snapshot
	}
	if rec.Network != nil {
		detail["egress_allow"] = rec.Network.Allow
		if len(rec.Network.Secrets) > 0 {
			detail["secrets"] = rec.Network.Secrets
		}
	}
	m.opts.Audit.Record(ctx, audit.Event{Tenant: rec.Tenant, Session: rec.ID, Kind: "session.start", Detail: detail})
	m.log.Info("session started", "session", rec.ID, "tenant", rec.Tenant, "path", path, "ms", d.Milliseconds())
}

// launch makes a new sandbox for the normalized req: record (in state
// initial), writable layer, runtime, agent; the record ends in state final.
// On failure everything is torn down and the record ends terminated with
// reason error (or deleted, when Destroy came while it was made).
func (m *Manager) launch(ctx context.Context, req node.CreateSpec, idempotencyKey, hash string, initial, final node.State) (*node.Session, error) {
	// From loading the template until the sandbox is live (and so counts
	// as a user of it), the template cannot be removed.
	m.tplMu.RLock()
	tplLocked := true
	defer func() {
		if tplLocked {
			m.tplMu.RUnlock()
		}
	}()
	tdir := m.opts.Layout.Template(req.Template)
	tpl, err := storage.LoadTemplate(tdir)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.InvalidField("template", "template %q does not exist", req.Template)
		}
		return nil, err
	}

	return m.launchWith(ctx, req, idempotencyKey, hash, initial, func() {
		if tplLocked {
			tplLocked = false
			m.tplMu.RUnlock()
		}
	}, func(ctx context.Context, sb *Sandbox) error {
		return m.start(ctx, sb, tpl, req, final)
	})
}

// launchWith makes the record of a new sandbox for req (in state
// initial), makes it live, calls live (the sandbox now counts as a user
// of its template) and then start. When start fails, everything is torn
// down and the record ends terminated with reason error (or deleted, when
// Destroy came while it was made).
func (m *Manager) launchWith(ctx context.Context, req node.CreateSpec, idempotencyKey, hash string, initial node.State,
	live func(), start func(ctx context.Context, sb *Sandbox) error) (*node.Session, error) {
	now := time.Now().UTC()
	sb := &Sandbox{
		id: newID(), killers: map[int]*time.Timer{}, feeding: map[int]chan struct{}{}, done: make(chan struct{}),
		created: make(chan struct{}),
	}
	defer close(sb.created)
	sb.dir = m.opts.Layout.Sandbox(sb.id)
	sb.res = reservationOf(ctx) // (a warm-pool member's context has none)
	sb.rec = node.Session{
		ID: sb.id, Template: req.Template, Driver: req.Isolation, State: initial,
		CPU: req.CPU, MemoryMB: req.MemoryMB, Pids: req.Pids, TimeoutS: req.TimeoutS,
		DefaultUser: req.User, Workdir: req.Workdir, Env: req.Env, Metadata: req.Metadata,
		IdempotencyKey: idempotencyKey, RequestHash: hash, CreatedAt: now,
		Snapshot: req.Snapshot, DiskMB: req.DiskMB, AutoPauseS: req.AutoPauseS,
		EnvdToken: newToken(), TrafficToken: newToken(), OnTimeout: req.OnTimeout, AutoResume: req.AutoResume,
		Network: copyNetwork(req.Network), Tenant: callerTenant(ctx), PublicTraffic: req.PublicTraffic,
		Volumes: append([]node.VolumeMount(nil), req.Volumes...),
	}
	if initial == node.StatePooled {
		sb.rec.Tenant = "" // a warm-pool member belongs to whoever claims it
	}
	if err := m.opts.Store.CreateSession(ctx, &sb.rec); err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.live[sb.id] = sb
	m.mu.Unlock()
	live()

	// Once started, a create runs to completion even if the caller goes
	// away: a retry with the same Idempotency-Key then finds the session.
	startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := start(startCtx, sb); err != nil {
		sb.mu.Lock()
		aborted := sb.deleteRequested
		sb.mu.Unlock()
		if aborted {
			// Destroy came while we were creating; it waits for this.
			m.log.Info("create aborted: session deleted", "session", sb.id)
			m.teardown(context.WithoutCancel(ctx), sb, node.ReasonDeleted, "")
			r := sb.Record()
			return nil, terminatedError(&r)
		}
		m.log.Error("create failed", "session", sb.id, "err", err)
		m.teardown(context.WithoutCancel(ctx), sb, node.ReasonError, publicDetail(err))
		if idempotencyKey != "" {
			// A retry with the key must try again (and get this error again,
			// or a session), not be told 200 with this failed one.
			if rerr := m.opts.Store.ReleaseIdempotencyKey(context.WithoutCancel(ctx), sb.id); rerr != nil {
				m.log.Error("release idempotency key", "session", sb.id, "err", rerr)
			}
		}
		return nil, err
	}
	r := sb.Record()
	return &r, nil
}

// publicDetail is the end detail a failed create leaves on its session
// record, which clients read: the error's message when its class is shown
// to them, else a pointer to the daemon's log (an internal error's text
// holds host paths and runtime output).
func publicDetail(err error) string {
	if errdefs.Class(err) == errdefs.ErrInternal {
		return "the sandbox could not be started; the daemon's log has the cause"
	}
	return err.Error()
}

// snapTemplate is the template of snapshot snap, "" when resolving it
// failed with err.
func snapTemplate(snap *node.Snapshot, err error) string {
	if err != nil || snap == nil {
		return ""
	}
	return snap.Template
}
