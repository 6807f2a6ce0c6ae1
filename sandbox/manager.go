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
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	v1 "github.com/forkbox/forkbox/api/v1"

	"github.com/forkbox/forkbox/errdefs"
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
