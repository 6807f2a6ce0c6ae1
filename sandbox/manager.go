// Package sandbox is the lifecycle manager: it creates sandboxes (template,
// writable layer, runtime, agent), tracks them through the state machine
// creating -> running -> terminating -> terminated (reason deleted, timeout
// or error), enforces session and exec timeouts from outside the sandbox,
// and reconciles its SQLite records with the runtime after a restart.
//
// Every client path (REST API, CLI, E2B compatibility) reaches a sandbox's
// processes and files through its agent, over the envd protocol.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	v1 "github.com/forkbox/forkbox/api/v1"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/agent"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/envdpb/filesystempb"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
)

// Options configure a Manager.
type Options struct {
	Layout storage.Layout
	Store  *store.Store
	Driver runtime.Driver
	// AgentPath is the forkbox-agent binary mounted into sandboxes.
	AgentPath string
	// Limits default and bound create requests.
	Limits v1.Limits
	// Shift maps sandbox ids to host ids (storage.DefaultIDShift).
	Shift storage.IDShift
	Log   *slog.Logger
}

// Manager owns every sandbox of this host. It is safe for concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu   sync.Mutex
	live map[string]*Sandbox // sandboxes in creating, running or terminating state

	// createMu serialises creates that carry the same idempotency key.
	createMu sync.Mutex
	// tplMu keeps template removal (write) apart from creates between
	// loading their template and becoming live (read), so that a template
	// is never removed from under a sandbox that is starting on it.
	tplMu     sync.RWMutex
	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// Sandbox is a live sandbox: its record and its connection to the agent.
type Sandbox struct {
	id    string
	dir   string
	agent *agentConn

	// saveMu orders record changes with their store writes: a change and
	// its write happen under it, so the store never ends up with an older
	// state written after a newer one.
	saveMu sync.Mutex

	mu      sync.Mutex
	rec     store.Session
	timer   *time.Timer           // fires at rec.ExpiresAt
	killers map[int]*time.Timer   // exec timeouts by in-sandbox pid
	feeding map[int]chan struct{} // closed when an exec's stdin data is written (KeepStdin)
	tearing bool                  // a teardown is in progress
	attempt chan struct{}         // closed when the current teardown attempt ends
	done    chan struct{}         // closed when terminated
	// deleteRequested: Destroy was called while the sandbox was being
	// created; the creator tears it down (reason deleted) instead of
	// making it running. abortReady stops the creator's wait for the agent.
	deleteRequested bool
	abortReady      context.CancelFunc
	created         chan struct{} // closed when Create is done with it (nil for adopted ones)
}

// errCreateAborted ends a create that was destroyed while it ran.
var errCreateAborted = errors.New("the session was deleted while it was being created")

// save applies change to sb's record and writes the result to the store,
// both under sb.saveMu so that concurrent changes reach the store in the
// order they were made. change runs under sb.mu; an error from it aborts
// the save and is returned as is.
func (m *Manager) save(ctx context.Context, sb *Sandbox, change func(r *store.Session) error) (store.Session, error) {
	sb.saveMu.Lock()
	defer sb.saveMu.Unlock()
	sb.mu.Lock()
	if err := change(&sb.rec); err != nil {
		sb.mu.Unlock()
		return store.Session{}, err
	}
	rec := sb.rec
	sb.mu.Unlock()
	return rec, m.opts.Store.UpdateSession(ctx, &rec)
}

// Record returns a copy of the sandbox's current record.
func (s *Sandbox) Record() store.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec
}

// AgentHTTP returns an HTTP client that reaches this sandbox's agent (any
// URL host; requests go to the agent's Unix socket). Used to proxy envd.
func (s *Sandbox) AgentHTTP() (*http.Client, string) { return s.agent.http, agentBaseURL }

// NewManager returns a manager. Call Recover before serving requests.
func NewManager(opts Options) *Manager {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	if opts.Shift.Size == 0 {
		opts.Shift = storage.DefaultIDShift
	}
	return &Manager{opts: opts, log: log, live: map[string]*Sandbox{}, closing: make(chan struct{})}
}

// Driver returns the isolation driver in use.
func (m *Manager) Driver() runtime.Driver { return m.opts.Driver }

// Limits returns the bounds applied to create requests.
func (m *Manager) Limits() v1.Limits { return m.opts.Limits }

// Create starts a new sandbox for req. With a non-empty idempotencyKey, a
// retry of the same request returns the session made by the first one
// (created is then false) and a different request with that key fails with
// ErrConflict. On any failure the half-made sandbox is torn down and its
// record ends as terminated with reason error.
func (m *Manager) Create(ctx context.Context, req v1.CreateRequest, idempotencyKey string) (rec *store.Session, created bool, err error) {
	if err := normalizeCreate(&req, m.opts.Limits); err != nil {
		return nil, false, err
	}
	hash := requestHash(&req)
	if idempotencyKey != "" {
		m.createMu.Lock()
		defer m.createMu.Unlock()
		prev, err := m.opts.Store.GetSessionByIdempotencyKey(ctx, idempotencyKey)
		if err == nil {
			if prev.RequestHash != hash {
				return nil, false, errdefs.Newf(errdefs.ErrConflict,
					"Idempotency-Key %q was used for a different request", idempotencyKey)
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
			return nil, false, errdefs.InvalidField("template", "template %q does not exist", req.Template)
		}
		return nil, false, err
	}

	now := time.Now().UTC()
	sb := &Sandbox{
		id: newID(), killers: map[int]*time.Timer{}, feeding: map[int]chan struct{}{}, done: make(chan struct{}),
		created: make(chan struct{}),
	}
	defer close(sb.created)
	sb.dir = m.opts.Layout.Sandbox(sb.id)
	sb.rec = store.Session{
		ID: sb.id, Template: req.Template, Driver: m.opts.Driver.Name(), State: store.StateCreating,
		CPU: req.CPU, MemoryMB: req.MemoryMB, Pids: req.Pids, TimeoutS: req.TimeoutS,
		DefaultUser: req.User, Workdir: req.Workdir, Env: req.Env, Metadata: req.Metadata,
		IdempotencyKey: idempotencyKey, RequestHash: hash, CreatedAt: now,
	}
	if err := m.opts.Store.CreateSession(ctx, &sb.rec); err != nil {
		return nil, false, err
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
	if err := m.start(startCtx, sb, tdir, tpl, req); err != nil {
		sb.mu.Lock()
		aborted := sb.deleteRequested
		sb.mu.Unlock()
		if aborted {
			// Destroy came while we were creating; it waits for this.
			m.log.Info("create aborted: session deleted", "session", sb.id)
			m.teardown(context.WithoutCancel(ctx), sb, store.ReasonDeleted, "")
			r := sb.Record()
			return nil, false, terminatedError(&r)
		}
		m.log.Error("create failed", "session", sb.id, "err", err)
		m.teardown(context.WithoutCancel(ctx), sb, store.ReasonError, err.Error())
		if idempotencyKey != "" {
			// A retry with the key must try again (and get this error again,
			// or a session), not be told 200 with this failed one.
			if rerr := m.opts.Store.ReleaseIdempotencyKey(context.WithoutCancel(ctx), sb.id); rerr != nil {
				m.log.Error("release idempotency key", "session", sb.id, "err", rerr)
			}
		}
		return nil, false, err
	}
	r := sb.Record()
	return &r, true, nil
}

// start builds the sandbox's files, starts it through the driver and waits
// for its agent; then the record becomes running and the timeout is armed.
func (m *Manager) start(ctx context.Context, sb *Sandbox, tdir string, tpl *storage.Template, req v1.CreateRequest) error {
	if err := os.MkdirAll(sb.dir, 0o711); err != nil {
		return err
	}
	layer, err := storage.CreateLayer(filepath.Join(sb.dir, "layer"), storage.RootFS(tdir), m.opts.Shift)
	if err != nil {
		return fmt.Errorf("writable layer: %w", err)
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
		mounts = append(mounts, runtime.Mount{Source: filepath.Join(layer.Merged(), d), Target: d})
	}
	mounts = append(mounts,
		runtime.Mount{Source: hosts, Target: "/etc/hosts", ReadOnly: true},
		runtime.Mount{Source: hostname, Target: "/etc/hostname", ReadOnly: true},
	)

	acfg := agent.Config{DefaultUser: req.User, Workdir: req.Workdir, Env: map[string]string{}}
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

	shift := m.opts.Shift
	idmap := []runtime.IDMap{{ContainerID: 0, HostID: shift.UIDBase, Size: shift.Size}}
	gidmap := []runtime.IDMap{{ContainerID: 0, HostID: shift.GIDBase, Size: shift.Size}}
	err = m.opts.Driver.Create(ctx, runtime.Config{
		ID: sb.id, StateDir: sb.dir, RootFS: layer.Merged(), Mounts: mounts,
		Limits:    runtime.Limits{CPU: req.CPU, MemoryBytes: req.MemoryMB << 20, Pids: req.Pids},
		AgentPath: m.opts.AgentPath, AgentEnv: []string{agent.ConfigEnv + "=" + string(acfgJSON)},
		AgentListener: lf, UIDMap: idmap, GIDMap: gidmap,
	})
	if err != nil {
		return err
	}
	sb.agent = newAgentConn(socket)
	readyCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sb.mu.Lock()
	sb.abortReady = cancel
	aborted := sb.deleteRequested
	sb.mu.Unlock()
	if aborted {
		return errCreateAborted
	}
	if err := sb.agent.waitReady(readyCtx); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	if err := m.checkDefaults(ctx, sb, req); err != nil {
		return err
	}

	if _, err := m.save(ctx, sb, func(r *store.Session) error {
		if sb.deleteRequested {
			return errCreateAborted
		}
		now := time.Now().UTC()
		r.State = store.StateRunning
		r.StartedAt = now
		r.ExpiresAt = now.Add(time.Duration(req.TimeoutS) * time.Second)
		return nil
	}); err != nil {
		return err
	}
	m.arm(sb)
	return nil
}

// checkDefaults makes sure the session's default user and working directory
// exist in its template, which only the agent can tell; else the create
// would succeed and every exec without a user or cwd of its own fail.
func (m *Manager) checkDefaults(ctx context.Context, sb *Sandbox, req v1.CreateRequest) error {
	p := req.Workdir
	if p == "" {
		p = "/"
	}
	sreq := connect.NewRequest(&filesystempb.StatRequest{Path: p})
	setUser(sreq.Header(), req.User)
	resp, err := sb.agent.fs.Stat(ctx, sreq)
	switch {
	case connect.CodeOf(err) == connect.CodeUnauthenticated:
		return errdefs.InvalidField("user", "user %q does not exist in template %q", req.User, req.Template)
	case connect.CodeOf(err) == connect.CodeNotFound:
		return errdefs.InvalidField("workdir", "%q does not exist in template %q", p, req.Template)
	case err != nil:
		return fmt.Errorf("agent: check user and workdir: %v: %w", err, errdefs.ErrUnavailable)
	case resp.Msg.GetEntry().GetType() == filesystempb.FileType_FILE_TYPE_FILE:
		return errdefs.InvalidField("workdir", "%q is not a directory", p)
	}
	return nil
}

func cutEnv(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

// arm (re)starts the session timer at the record's expiry, unless the
// sandbox is no longer running (a teardown stopped its timer for good).
func (m *Manager) arm(sb *Sandbox) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.tearing || sb.rec.State != store.StateRunning {
		return
	}
	if sb.timer != nil {
		sb.timer.Stop()
	}
	d := time.Until(sb.rec.ExpiresAt)
	sb.timer = time.AfterFunc(d, func() {
		m.log.Info("session timed out", "session", sb.id)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		m.teardown(ctx, sb, store.ReasonTimeout, "session timeout reached")
	})
}

// lookup returns the live sandbox with id, or nil.
func (m *Manager) lookup(id string) *Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id]
}

// Get returns the session's record; ErrNotFound for an unknown id.
func (m *Manager) Get(ctx context.Context, id string) (*store.Session, error) {
	if sb := m.lookup(id); sb != nil {
		r := sb.Record()
		return &r, nil
	}
	return m.opts.Store.GetSession(ctx, id)
}

// List returns sessions matching f, newest first, with live state.
func (m *Manager) List(ctx context.Context, f store.SessionFilter) ([]*store.Session, error) {
	recs, err := m.opts.Store.ListSessions(ctx, f)
	if err != nil {
		return nil, err
	}
	for i, r := range recs {
		if sb := m.lookup(r.ID); sb != nil {
			live := sb.Record()
			recs[i] = &live
		}
	}
	return recs, nil
}

// running returns the live, running sandbox with id. ErrNotFound for an
// unknown id; ErrTerminated (with the reason) for one that has ended;
// ErrConflict while it is being created or torn down.
func (m *Manager) running(ctx context.Context, id string) (*Sandbox, error) {
	if sb := m.lookup(id); sb != nil {
		r := sb.Record()
		if r.State == store.StateRunning {
			return sb, nil
		}
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, r.State)
	}
	rec, err := m.opts.Store.GetSession(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State == store.StateTerminated {
		return nil, terminatedError(rec)
	}
	return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, rec.State)
}

func terminatedError(rec *store.Session) error {
	msg := fmt.Sprintf("session %s ended (%s)", rec.ID, rec.Reason)
	if rec.Detail != "" {
		msg += ": " + rec.Detail
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrTerminated)
}

// SetTimeout sets the session to expire seconds from now (E2B semantics:
// extend or shorten from now). ErrInvalidArgument outside 1..MaxTimeoutS.
func (m *Manager) SetTimeout(ctx context.Context, id string, seconds int64) (*store.Session, error) {
	if seconds < 1 || seconds > m.opts.Limits.MaxTimeoutS {
		return nil, errdefs.InvalidField("timeout_s", "must be between 1 and %d seconds", m.opts.Limits.MaxTimeoutS)
	}
	sb, err := m.running(ctx, id)
	if err != nil {
		return nil, err
	}
	rec, err := m.save(ctx, sb, func(r *store.Session) error {
		if sb.tearing || r.State != store.StateRunning {
			// A teardown started since running() looked.
			return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, store.StateTerminating)
		}
		r.ExpiresAt = time.Now().UTC().Add(time.Duration(seconds) * time.Second)
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.arm(sb)
	return &rec, nil
}

// Destroy tears the session down now (reason deleted). Destroying a session
// that already ended is a no-op; an unknown id is ErrNotFound. A session
// still being created is not torn down under its creator's feet: the
// create is told to stop and tear down itself, and Destroy waits for that.
func (m *Manager) Destroy(ctx context.Context, id string) error {
	sb := m.lookup(id)
	if sb == nil {
		rec, err := m.opts.Store.GetSession(ctx, id)
		if err != nil {
			return err
		}
		if rec.State == store.StateTerminated {
			return nil
		}
		return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, rec.State)
	}
	sb.mu.Lock()
	if sb.rec.State == store.StateCreating && !sb.tearing && sb.created != nil {
		sb.deleteRequested = true
		abort := sb.abortReady
		sb.mu.Unlock()
		if abort != nil {
			abort()
		}
		select {
		case <-sb.created:
		case <-ctx.Done():
			return ctx.Err()
		}
		if sb.Record().State != store.StateTerminated {
			return fmt.Errorf("teardown of session %s is incomplete and will be retried: %w", id, errdefs.ErrUnavailable)
		}
		return nil
	}
	sb.mu.Unlock()
	return m.teardown(ctx, sb, store.ReasonDeleted, "")
}

// teardown moves sb to terminating, removes everything it has on the host
// (processes, cgroups, runtime state, mounts, writable layer, files) and
// records it as terminated with reason. If removal fails the record stays
// terminating (with the first reason) and the janitor retries. Concurrent
// calls are safe: one tears down, the others wait for it.
func (m *Manager) teardown(ctx context.Context, sb *Sandbox, reason, detail string) error {
	// A caller that goes away (a client disconnecting) must not leave a
	// teardown half done.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var attempt chan struct{} // this call's attempt, or the one to wait for
	_, err := m.save(ctx, sb, func(r *store.Session) error {
		if sb.tearing || r.State == store.StateTerminated {
			attempt = sb.attempt
			return errTeardownRunning
		}
		sb.tearing = true
		attempt = make(chan struct{})
		sb.attempt = attempt
		if sb.timer != nil {
			sb.timer.Stop()
		}
		for _, t := range sb.killers {
			t.Stop()
		}
		if r.State != store.StateTerminating {
			// A retry keeps the reason recorded by the first attempt.
			r.State = store.StateTerminating
			r.Reason, r.Detail = reason, detail
		}
		return nil
	})
	if errors.Is(err, errTeardownRunning) {
		// Another call tears down; its outcome is ours.
		if attempt != nil {
			select {
			case <-attempt:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if sb.Record().State != store.StateTerminated {
			return fmt.Errorf("teardown of session %s is incomplete and will be retried: %w", sb.id, errdefs.ErrUnavailable)
		}
		return nil
	}
	defer close(attempt)
	if err != nil {
		m.log.Error("record terminating", "session", sb.id, "err", err)
	}
	if err := m.cleanup(ctx, sb.id); err != nil {
		m.log.Error("teardown incomplete; janitor will retry", "session", sb.id, "err", err)
		sb.mu.Lock()
		sb.tearing = false
		sb.mu.Unlock()
		return err
	}
	if sb.agent != nil {
		sb.agent.close()
	}
	if _, err := m.save(ctx, sb, func(r *store.Session) error {
		r.State = store.StateTerminated
		r.EndedAt = time.Now().UTC()
		return nil
	}); err != nil {
		m.log.Error("record terminated", "session", sb.id, "err", err)
	}
	m.mu.Lock()
	delete(m.live, sb.id)
	m.mu.Unlock()
	close(sb.done)
	m.log.Info("session ended", "session", sb.id, "reason", reason)
	return nil
}

// errTeardownRunning: another call is tearing the sandbox down already.
var errTeardownRunning = errors.New("teardown in progress")

// cleanup removes every host resource of sandbox id; it is idempotent.
func (m *Manager) cleanup(ctx context.Context, id string) error {
	if err := m.opts.Driver.Delete(ctx, id); err != nil {
		return err
	}
	dir := m.opts.Layout.Sandbox(id)
	if err := storage.RemoveLayer(filepath.Join(dir, "layer")); err != nil {
		return err
	}
	return storage.RemoveTree(dir)
}

// Close stops timers and background work. Sandboxes keep running; the next
// daemon adopts them in Recover. Calls after the first do nothing.
func (m *Manager) Close() {
	m.closeOnce.Do(m.close)
}

func (m *Manager) close() {
	close(m.closing)
	m.mu.Lock()
	for _, sb := range m.live {
		sb.mu.Lock()
		if sb.timer != nil {
			sb.timer.Stop()
		}
		for _, t := range sb.killers {
			t.Stop()
		}
		sb.mu.Unlock()
		if sb.agent != nil {
			sb.agent.close()
		}
	}
	m.mu.Unlock()
	m.wg.Wait()
}

func layerOf(sandboxDir string) storage.Layer {
	return storage.Layer{Dir: filepath.Join(sandboxDir, "layer")}
}

// RemoveTemplateIfUnused runs remove (which takes template name's files
// away) only if no live session uses name, and keeps creates from starting
// on name while it runs. ErrConflict when a session uses it.
func (m *Manager) RemoveTemplateIfUnused(name string, remove func() error) error {
	m.tplMu.Lock()
	defer m.tplMu.Unlock()
	if m.TemplateInUse(name) {
		return errdefs.Newf(errdefs.ErrConflict, "template %q is used by running sessions", name)
	}
	return remove()
}

// TemplateInUse reports whether a live session runs on template name.
func (m *Manager) TemplateInUse(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.live {
		if sb.Record().Template == name {
			return true
		}
	}
	return false
}
