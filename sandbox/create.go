package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
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
// taken when there is one.
func (m *Manager) Create(ctx context.Context, req node.CreateSpec, idempotencyKey string) (rec *node.Session, created bool, err error) {
	return m.create(ctx, req, idempotencyKey, true)
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
	if err := normalizeCreate(&req, m.opts.Limits); err != nil {
		return nil, false, err
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
	}
	if err := m.runtimes.pickDriver(&req); err != nil {
		return nil, false, err
	}
	hash := requestHash(&req)
	if idempotencyKey != "" {
		// Keys are per tenant: stored as "tenant/key".
		idempotencyKey = tenant + "/" + idempotencyKey
		defer m.keyLocks.lock(idempotencyKey)()
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
		if snap.MemoryDriver != "" && snap.MemoryDriver != req.Isolation {
			return nil, false, errdefs.InvalidField("isolation", "snapshot %s holds memory that only isolation %q can restore",
				snap.ID, snap.MemoryDriver)
		}
		if need := (snap.MemoryBytes + 1<<20 - 1) >> 20; snap.MemoryDriver != "" && req.MemoryMB < need {
			return nil, false, errdefs.InvalidField("memory_mb", "snapshot %s holds %d MiB of memory: give at least that",
				snap.ID, need)
		}
	}
	if !m.tpls.templateVisible(ctx, req.Template) {
		return nil, false, errdefs.InvalidField("template", "template %q does not exist", req.Template)
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
			if err := m.opts.Storage.Verify(ctx, snap.ID); err != nil {
				return nil, false, err
			}
		}
	} else if req.Network != nil {
		// Warm-pool members have no network; a network is made per sandbox.
	} else if rec, err := m.warm.Claim(ctx, req, idempotencyKey, hash); rec != nil || err != nil {
		if rec != nil {
			m.started(ctx, rec, "pool", began)
		}
		return rec, rec != nil, err
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
		EnvdToken: newToken(), OnTimeout: req.OnTimeout, AutoResume: req.AutoResume,
		Network: copyNetwork(req.Network), Tenant: callerTenant(ctx),
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
	m.tplMu.RUnlock()
	tplLocked = false

	// Once started, a create runs to completion even if the caller goes
	// away: a retry with the same Idempotency-Key then finds the session.
	startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := m.start(startCtx, sb, tpl, req, final); err != nil {
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

// start builds the sandbox's files, starts it through the driver and waits
// for its agent; then the record becomes final (running, or pooled for a
// warm-pool member) and a running session's timeout is armed.
func (m *Manager) start(ctx context.Context, sb *Sandbox, tpl *storage.Template, req node.CreateSpec, final node.State) error {
	began := time.Now()
	if err := os.MkdirAll(sb.dir, 0o710); err != nil {
		return err
	}
	// A memory snapshot's checkpoint is verified and decrypted first: a
	// tampered one stops the create before anything starts.
	var image string
	var gen uint64
	if req.Snapshot != "" {
		sn, err := m.opts.Store.GetSnapshot(ctx, req.Snapshot)
		if err != nil {
			return err
		}
		if sn.MemoryDriver != "" {
			dir, g, release, err := m.snaps.OpenMemory(sn)
			if err != nil {
				return err
			}
			defer release()
			image, gen = dir, g
		}
	}
	rootfs, err := m.opts.Storage.Prepare(ctx, sb.id,
		storage.Source{Template: req.Template, Snapshot: req.Snapshot}, req.DiskMB<<20)
	if err != nil {
		return fmt.Errorf("writable layer: %w", err)
	}
	if err := checkMountTargets(rootfs, tpl); err != nil {
		return err
	}
	ident, err := m.hostRes.newIdentity(sb, rootfs)
	if err != nil {
		return err
	}
	hosts := filepath.Join(sb.dir, "hosts")
	hostsData := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", sb.id)
	if err := os.WriteFile(hosts, []byte(hostsData), 0o644); err != nil {
		return err
	}
	hostname := filepath.Join(sb.dir, "hostname")
	if err := os.WriteFile(hostname, []byte(sb.id+"\n"), 0o644); err != nil {
		return err
	}
	mounts := append([]runtime.Mount(nil), tpl.HostMounts...)
	for _, d := range []string{"/home/user", "/root", "/tmp"} {
		mounts = append(mounts, runtime.Mount{Source: filepath.Join(rootfs, d), Target: d})
	}
	// Every sandbox has its own machine id (a clone of a memory snapshot
	// too: the file is read from its own state directory).
	machineID := filepath.Join(sb.dir, "machine-id")
	if err := os.WriteFile(machineID, []byte(newToken()[:32]+"\n"), 0o644); err != nil {
		return err
	}
	ctlDir := filepath.Join(sb.dir, "ctl")
	if err := os.Mkdir(ctlDir, 0o755); err != nil {
		return err
	}
	if image != "" {
		if err := writeResume(ctlDir, wire.ResumeFile{Generation: gen, Hostname: sb.id}); err != nil {
			return err
		}
	}
	mounts = append(mounts,
		runtime.Mount{Source: hosts, Target: "/etc/hosts", ReadOnly: true},
		runtime.Mount{Source: hostname, Target: "/etc/hostname", ReadOnly: true},
		runtime.Mount{Source: machineID, Target: "/etc/machine-id", ReadOnly: true},
	)
	// A sandbox with an identity joins its own user namespace, so its
	// network namespace must be owned by that one (made with it).
	var makeNetns func(path string) error
	if ident != nil {
		if sb.Record().Network != nil {
			makeNetns = func(path string) error { return ident.create(ctx, path) }
		} else if err := ident.create(ctx, ""); err != nil {
			return err
		}
	}
	att, err := m.hostRes.attachNetwork(sb, false, makeNetns)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	netnsPath := ""
	if att != nil {
		sb.mu.Lock()
		sb.net = att
		sb.mu.Unlock()
		resolv := filepath.Join(sb.dir, "resolv.conf")
		if err := os.WriteFile(resolv, att.Resolv(), 0o644); err != nil {
			return err
		}
		mounts = append(mounts, runtime.Mount{Source: resolv, Target: "/etc/resolv.conf", ReadOnly: true})
		netnsPath = att.NetnsPath
	}

	acfg := wire.Config{DefaultUser: req.User, Workdir: req.Workdir, Env: map[string]string{}}
	if acfg.Workdir == "" {
		acfg.Workdir = tpl.Workdir
	}
	for _, kv := range tpl.Env {
		k, v, _ := cutEnv(kv)
		if k == "PATH" {
			acfg.Path = v
			continue
		}
		acfg.Env[k] = v
	}
	for k, v := range req.Env {
		acfg.Env[k] = v
	}
	if att != nil {
		for _, kv := range att.Env() {
			k, v, _ := cutEnv(kv)
			acfg.Env[k] = v
		}
	}
	acfgJSON, err := json.Marshal(acfg)
	if err != nil {
		return err
	}

	socket := filepath.Join(sb.dir, "agent.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("agent socket: %w", err)
	}
	ul.SetUnlinkOnClose(false)
	defer ul.Close()
	if err := os.Chmod(socket, 0o600); err != nil {
		return err
	}
	lf, err := ul.File()
	if err != nil {
		return err
	}
	defer lf.Close()

	prepared := time.Now()
	shift := m.opts.Shift
	idmap := []runtime.IDMap{{ContainerID: 0, HostID: shift.UIDBase, Size: shift.Size}}
	gidmap := []runtime.IDMap{{ContainerID: 0, HostID: shift.GIDBase, Size: shift.Size}}
	rcfg := runtime.Config{
		ID: sb.id, StateDir: sb.dir, RootFS: rootfs, Mounts: mounts,
		Limits:    runtime.Limits{CPU: req.CPU, MemoryBytes: req.MemoryMB << 20, Pids: req.Pids},
		AgentPath: m.opts.AgentPath, AgentEnv: []string{wire.ConfigEnv + "=" + string(acfgJSON)},
		AgentListener: lf, UIDMap: idmap, GIDMap: gidmap, NetnsPath: netnsPath, ControlDir: ctlDir,
		Rlimits: m.runtimes.rlimits(),
	}
	if ident != nil {
		ident.apply(&rcfg, rootfs)
	}
	if image != "" {
		err = m.runtimes.driverOf(sb).Restore(ctx, rcfg, image)
	} else {
		err = m.runtimes.driverOf(sb).Create(ctx, rcfg)
	}
	if err != nil {
		return templateMountError(err, tpl)
	}
	launched := time.Now()
	sb.agent = guest.New(socket)
	if err := m.awaitAgent(ctx, sb, m.runtimes.readyWait(m.runtimes.driverOf(sb))); err != nil {
		return err
	}
	if image != "" {
		// The restored agent has the snapshot's settings: give it this
		// session's.
		if err := m.initAgent(ctx, sb, req); err != nil {
			return err
		}
	}
	if err := m.checkDefaults(ctx, sb, req); err != nil {
		return err
	}

	if _, err := m.save(ctx, sb, func(r *node.Session) error {
		if sb.deleteRequested {
			return errCreateAborted
		}
		now := time.Now().UTC()
		r.State = final
		r.StartedAt = now
		if final == node.StateRunning {
			r.ExpiresAt = now.Add(time.Duration(req.TimeoutS) * time.Second)
		}
		sb.lastUse = now
		return nil
	}); err != nil {
		return err
	}
	m.arm(sb)
	m.armIdle(sb)
	m.log.Debug("sandbox started", "session", sb.id, "prepare_ms", ms(prepared.Sub(began)),
		"runtime_ms", ms(launched.Sub(prepared)), "agent_ms", ms(time.Since(launched)))
	return nil
}

// ms is d in milliseconds with a fraction, for logs.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// checkDefaults makes sure the session's default user and working directory
// exist in its template, which only the agent can tell; else the create
// would succeed and every exec without a user or cwd of its own fail.
//
// The standard accounts with no workdir need no check: the agent resolves
// "user" and "root" even without passwd entries, and every template has
// their homes (storage.PrepareUserDirs). That spares most creates a round
// trip while the fresh agent is still cold (several ms).
func (m *Manager) checkDefaults(ctx context.Context, sb *Sandbox, req node.CreateSpec) error {
	if req.Workdir == "" && (req.User == "user" || req.User == "root") {
		return nil
	}
	p := req.Workdir
	if p == "" {
		p = "/"
	}
	e, err := sb.agent.Stat(ctx, p, req.User)
	switch class := guest.Classify(ctx, err, ""); {
	case err == nil && e.Type == "file":
		return errdefs.InvalidField("workdir", "%q is not a directory", p)
	case err == nil:
		return nil
	case errdefs.Field(class) == "user": // (the agent's unauthenticated)
		return errdefs.InvalidField("user", "user %q does not exist in template %q", req.User, req.Template)
	case errors.Is(class, errdefs.ErrNotFound):
		return errdefs.InvalidField("workdir", "%q does not exist in template %q", p, req.Template)
	}
	return fmt.Errorf("agent: check user and workdir: %v: %w", err, errdefs.ErrUnavailable)
}

func cutEnv(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

// keyedMutex is a set of mutexes by key, each there only while used.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int
}

// lock locks key and returns its unlock.
func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// templateMountError turns a runtime's failure to mount one of the
// sandbox's own files into imported template tpl (its /etc/hosts is a
// symlink into /proc, say: storage.PrepareMountTargets replaces such
// entries at import, so only templates imported before it have them)
// into an invalid-argument error naming the template. Other errors, and
// any error with the built-in template (which forkbox writes itself),
// are returned as they are.
func templateMountError(err error, tpl *storage.Template) error {
	var me *runtime.MountError
	if !errors.As(err, &me) || tpl.Source == "builtin" {
		return err
	}
	return errdefs.InvalidField("template", "template %q cannot be started: %v, because the template has a symlink, "+
		"a directory or a special file there; delete the template and import it again (imports now replace such entries)",
		tpl.Name, me)
}

// checkMountTargets refuses, before the runtime is asked, a root
// filesystem of imported template tpl whose etc or storage.MountTargets
// are of a kind the sandbox's own files cannot be mounted over (only
// templates imported before storage.PrepareMountTargets existed have
// them): the runtimes fail on them with errors that do not always say
// which path (runsc), so the check is made here for every tier. Missing
// entries are fine (the runtime creates them). Nothing is followed: etc
// must be a real directory before anything in it is looked at.
func checkMountTargets(rootfs string, tpl *storage.Template) error {
	if tpl.Source == "builtin" {
		return nil
	}
	bad := func(target, kind string) error {
		return errdefs.InvalidField("template", "template %q cannot be started: its %s is %s, which the sandbox's own "+
			"file cannot be mounted over; delete the template and import it again (imports now replace such entries)",
			tpl.Name, target, kind)
	}
	fi, err := os.Lstat(filepath.Join(rootfs, "etc"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !fi.IsDir():
		return bad("/etc", kindOf(fi.Mode()))
	}
	for _, rel := range storage.MountTargets {
		fi, err := os.Lstat(filepath.Join(rootfs, rel))
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return err
		case !fi.Mode().IsRegular():
			return bad("/"+rel, kindOf(fi.Mode()))
		}
	}
	return nil
}

// kindOf names the kind of file of mode m ("a symlink").
func kindOf(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "a symlink"
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	}
	return "a special file"
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
