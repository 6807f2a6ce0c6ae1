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
	"github.com/forkbox/forkbox/broker"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/volume"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/inflight"
	"github.com/forkbox/forkbox/internal/keyed"
	"github.com/forkbox/forkbox/metrics"
	"github.com/forkbox/forkbox/monitor"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/userns"
)

// Options configure a Manager.
type Options struct {
	Layout datadir.Layout
	Store  *store.Store
	// Drivers are the isolation drivers this host has; a session picks
	// one by name (CreateRequest.Isolation) and keeps it for its life.
	Drivers []runtime.Driver
	// DefaultDriver names the driver of sessions that pick none; "" is
	// the first of Drivers.
	DefaultDriver string
	// SnapshotKey seals memory checkpoints at rest (storage/seal; the
	// composition hands it to package snapshot); nil: no memory snapshots.
	SnapshotKey *seal.Key
	// MemoryImageCacheBytes bounds the decrypted memory checkpoints the
	// snapshot service keeps for later restores (snapshot.Options).
	MemoryImageCacheBytes int64
	// Storage holds the sandboxes' writable layers and snapshots.
	Storage storage.Driver
	// AgentPath is the forkbox-agent binary mounted into sandboxes.
	AgentPath string
	// AgentReadyTimeout is how long a create waits for a new sandbox's
	// agent to answer on an unloaded host, for runc; gVisor's is longer
	// and both grow with the host's load (readyWait). Zero:
	// defaults.AgentReadyTimeout.
	AgentReadyTimeout time.Duration
	// Limits default and bound create requests.
	Limits node.Limits
	// Shift maps sandbox ids to the host ids their files have on disk
	// (storage.DefaultIDShift).
	Shift storage.IDShift
	// IDs hands out each sandbox's own host ids (package userns); nil:
	// sandboxes run on the storage ids in namespaces the runtime makes.
	IDs *userns.Claims
	// Net gives sessions that ask for one a network through the egress
	// proxy; nil: such creates are refused.
	Net *netpolicy.Service
	// Secrets is the credential broker's secret service: sessions that
	// ask for secrets get placeholders bound through it; nil: such
	// creates are refused.
	Secrets *broker.Secrets
	// Volumes mounts tenants' volumes into the sessions that ask for them
	// (package volume); nil: such creates are refused.
	Volumes *volume.Service
	// admission.Capacity bounds what the host runs at once (503
	// capacity-unavailable past it).
	Capacity admission.Capacity
	// Audit records lifecycle events, policy decisions and abuse kills;
	// nil records nothing.
	Audit *audit.Recorder
	// Metrics counts events; nil counts nothing.
	Metrics *metrics.Set
	// FleetQuota holds tenants' max_sessions and max_snapshots over the
	// whole fleet (admission.Options.Fleet); nil: over this host only.
	FleetQuota admission.FleetQuota
	// Abuse tunes the abuse detector (zero: abuse.DefaultConfig).
	Abuse abuse.Config
	// ExecInflight bounds the exec bytes in flight per tenant and in all
	// (PrepareExec); nil: the defaults of inflight.New.
	ExecInflight *inflight.Budget
	Log          *slog.Logger
}

// Manager owns every sandbox of this host: the lifecycle core (create,
// start, stop, teardown, pause and resume, timers, lookup, use and save).
// What it offers beyond that is on the types Concerns returns. It is safe
// for concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu   sync.Mutex
	live map[string]*Sandbox // sandboxes in creating, running or terminating state
	// adm admits sessions and holds the admission counts (package
	// admission); StopAll stops it, so creates are refused from then on.
	adm *admission.Controller
	// mon samples running sessions and ends them on its verdicts
	// (package monitor, through monitorCore).
	mon *monitor.Monitor

	// keyLocks serialises creates that carry the same (tenant-scoped)
	// idempotency key, and only those.
	keyLocks keyed.Mutex
	// tplMu keeps template removal (write) apart from creates between
	// loading their template and becoming live (read), so that a template
	// is never removed from under a sandbox that is starting on it.
	tplMu sync.RWMutex
	// warm are the warm pools (package pool, through members.go).
	warm        WarmPools
	closing     chan struct{}
	closeOnce   sync.Once
	quiesceOnce sync.Once // Quiesce
	wg          sync.WaitGroup
	// egressQueue feeds recordEgress; egressDropped counts records lost
	// because it was full.
	egressQueue   chan node.EgressRecord
	egressDropped atomic.Int64
	// snaps are the snapshots creates start from (package snapshot,
	// through snapcore.go).
	snaps SnapshotHooks
	// idmapOnce logs once that the storage cannot be id-mapped.
	idmapOnce sync.Once
	// spareOnce makes the spares' shared root (spareErr: why not).
	spareOnce sync.Once
	spareErr  error
	// spareFailures counts the spare fills in a row that failed for
	// reasons of the host (maxSpareFailures).
	spareFailures atomic.Int32
	// inflight is the budget of exec bytes in flight (stage.go).
	inflight *inflight.Budget

	// The concerns around the lifecycle core, each on a type of its own
	// that calls back into the core (see Concerns).
	files    *Files
	cmds     *Commands
	meter    *Meter
	tpls     *Templates
	tenants  *Tenants
	recovery *Recovery
	runtimes *Runtimes
	// hostRes hands sandboxes their host ids and networks (not a
	// concern of its own outside the core, so not in Concerns).
	hostRes *hostResources
}

// Concerns are the types that own what a Manager offers beyond the
// lifecycle core; host.Node embeds them beside the Manager. Each is bound
// to the Manager that returned it.
type Concerns struct {
	Files     *Files
	Commands  *Commands
	Meter     *Meter
	Templates *Templates
	Tenants   *Tenants
	Recovery  *Recovery
	Runtimes  *Runtimes
}

// Concerns returns m's concern types (the same values on every call).
func (m *Manager) Concerns() Concerns {
	return Concerns{Files: m.files, Commands: m.cmds, Meter: m.meter, Templates: m.tpls,
		Tenants: m.tenants, Recovery: m.recovery, Runtimes: m.runtimes}
}

// Sandbox is a live sandbox: its record and its connection to the agent.
type Sandbox struct {
	id    string
	dir   string
	agent *guest.Client

	// saveMu orders record changes with their store writes: a change and
	// its write happen under it, so the store never ends up with an older
	// state written after a newer one.
	saveMu sync.Mutex

	mu      sync.Mutex
	rec     node.Session
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
	// fillTemplate is the template a spare is being given (it counts as
	// a user of it from then on); under mu.
	fillTemplate string
	// abused: the monitor's EndForAbuse took it on (the tenant is flagged and the abuse
	// recorded once, whoever else saw it).
	abused bool

	// lifeMu serialises pause, resume and snapshot of this sandbox.
	lifeMu sync.Mutex
	// starts keeps a pause out while the agent starts a command.
	starts startGate
	// inflight counts exec and files calls in progress; lastUse is when the
	// last one began or ended; idle fires the auto-pause check. (A session
	// paused for idleness has rec.AutoPaused set, kept across daemon
	// restarts, and resumes on its next call.)
	inflight int
	lastUse  time.Time
	idle     *time.Timer
	// net is the sandbox's network (nil: loopback only); under mu.
	net *netpolicy.Attachment
	// res is its place in the admission counts, released when it ends
	// (nil for warm-pool members until claimed); under mu.
	res *admission.Reservation
	// streamCuts counts the memory snapshots that prepared the agent (and
	// so cut its open streams), for telling such a cut from a failure.
	streamCuts atomic.Uint64
}

// errCreateAborted ends a create that was destroyed while it ran.
var errCreateAborted = errors.New("the session was deleted while it was being created")

// save applies change to sb's record and writes the result to the store,
// both under sb.saveMu so that concurrent changes reach the store in the
// order they were made. change runs under sb.mu; an error from it aborts
// the save and is returned as is.
func (m *Manager) save(ctx context.Context, sb *Sandbox, change func(r *node.Session) error) (node.Session, error) {
	sb.saveMu.Lock()
	defer sb.saveMu.Unlock()
	sb.mu.Lock()
	if err := change(&sb.rec); err != nil {
		sb.mu.Unlock()
		return node.Session{}, err
	}
	rec := sb.rec
	sb.mu.Unlock()
	return rec, m.opts.Store.UpdateSession(ctx, &rec)
}

// Record returns a copy of the sandbox's current record.
func (s *Sandbox) Record() node.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec
}

// NewManager returns a manager. Call Recovery.Recover (its Concerns) before serving requests.
func NewManager(opts Options) *Manager {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	if opts.Shift.Size == 0 {
		opts.Shift = storage.DefaultIDShift
	}
	m := &Manager{opts: opts, log: log, live: map[string]*Sandbox{}, closing: make(chan struct{}),
		warm: noPools{}, snaps: noSnapshots{}, egressQueue: make(chan node.EgressRecord, 4096)}
	m.files, m.cmds, m.meter = &Files{agentCalls{m}}, &Commands{agentCalls{m}}, &Meter{agentCalls{m}}
	m.tpls, m.tenants, m.recovery = &Templates{m}, &Tenants{m}, &Recovery{m}
	m.runtimes, m.hostRes = &Runtimes{m}, &hostResources{m}
	m.adm = admission.New(admission.Options{Store: opts.Store, Capacity: opts.Capacity, Audit: opts.Audit, Metrics: opts.Metrics,
		Fleet: opts.FleetQuota, ImportsDir: opts.Layout.FleetImports()})
	m.mon = monitor.New(monitor.Options{Core: monitorCore{m}, Admission: m.adm, Store: opts.Store,
		Audit: opts.Audit, Metrics: opts.Metrics, Abuse: opts.Abuse, Log: log})
	if m.inflight = opts.ExecInflight; m.inflight == nil {
		m.inflight, _ = inflight.New(inflight.Limits{}, node.ExecOverhead+node.MaxExecBody)
	}
	m.wg.Add(2)
	go m.meter.recordEgress()
	go func() {
		defer m.wg.Done()
		m.mon.Run(m.closing)
	}()
	return m
}

// arm (re)starts the session timer at the record's expiry, unless the
// sandbox is no longer running or paused (a teardown stopped its timer for
// good). For a paused session the expiry is the end of the longest pause.
func (m *Manager) arm(sb *Sandbox) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.tearing || !isLive(sb.rec.State) {
		return
	}
	if sb.timer != nil {
		sb.timer.Stop()
	}
	select {
	case <-m.closing:
		return // a stopping daemon arms nothing (Quiesce)
	default:
	}
	detail := "session timeout reached"
	if sb.rec.State == node.StatePaused {
		detail = fmt.Sprintf("paused for longer than %d s", m.opts.Limits.MaxTimeoutS)
	}
	pauseInstead := sb.rec.State == node.StateRunning && sb.rec.OnTimeout == node.OnTimeoutPause
	// Timer.Stop cannot recall a callback that has started, so the
	// callback acts only if the timeout is still due when it records its
	// action (timeoutDue, in the same save): a SetTimeout that saved first
	// wins, and one that comes later finds the session ending.
	sb.timer = time.AfterFunc(time.Until(sb.rec.ExpiresAt), func() {
		if rec := sb.Record(); !timeoutDue(&rec) {
			return // moved meanwhile; the timer armed with it rules
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if pauseInstead {
			_, err := m.pause(ctx, sb.id, pauseTimeout)
			if err == nil || errors.Is(err, errNotDue) {
				return
			}
			if st := sb.Record().State; st != node.StateRunning {
				return // resumed, paused or ended meanwhile: its own timer rules
			}
			m.log.Error("pause on timeout failed; ending the session", "session", sb.id, "err", err)
		}
		if err := m.teardownIf(ctx, sb, node.ReasonTimeout, detail, timeoutDue); errors.Is(err, errNotDue) {
			return
		}
		m.log.Info("session timed out", "session", sb.id, "detail", detail)
	})
}

// SetTimeout sets the session to expire seconds from now (E2B semantics:
// extend or shorten from now); for a paused session it sets the time left
// when it resumes. ErrInvalidArgument outside 1..MaxTimeoutS, or over the
// tenant's max_timeout_s.
func (m *Manager) SetTimeout(ctx context.Context, id string, seconds int64) (*node.Session, error) {
	if seconds < 1 || seconds > m.opts.Limits.MaxTimeoutS {
		return nil, errdefs.InvalidField("timeout_s", "must be between 1 and %d seconds", m.opts.Limits.MaxTimeoutS)
	}
	sb := m.find(ctx, id)
	if sb == nil || sb.Record().State == node.StatePooled {
		_, _, err := m.use(ctx, id) // the right error for an ended or unknown session
		return nil, err
	}
	if err := m.adm.CheckTimeout(ctx, sb.Record().Tenant, seconds); err != nil {
		return nil, err
	}
	d := time.Duration(seconds) * time.Second
	paused := false
	rec, err := m.save(ctx, sb, func(r *node.Session) error {
		switch {
		case sb.tearing || r.State == node.StateTerminating || r.State == node.StateTerminated:
			return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, node.StateTerminating)
		case r.State == node.StatePaused:
			paused = true
			r.Remaining = d
		case r.State == node.StateRunning:
			r.ExpiresAt = time.Now().UTC().Add(d)
		default:
			return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, r.State)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !paused {
		m.arm(sb)
	}
	return &rec, nil
}

// isLive reports whether a session in state st has a sandbox on the host
// that can be inspected (running or paused).
func isLive(st node.State) bool {
	return st == node.StateRunning || st == node.StatePaused
}
