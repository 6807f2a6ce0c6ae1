// Package pool keeps warm pools: per template, a number of sandboxes
// created ahead of time and kept ready (state pooled, invisible to users).
// A create that asks for the pool's template and limits, without a
// snapshot or a network, takes the oldest ready member: the lifecycle core
// hands the session's settings to its agent and the member's record
// becomes the session's. A member is used once and never returned; the
// refiller replaces it in the background. Members that fail are torn down
// and replaced.
//
// The package depends on the lifecycle core through Core only (launch a
// member, hand one to a create, tear one down); the core reaches the pools
// through the methods Claim, Drop, Halt, Filling and Load, which it
// declares as an interface of its own, so that imports run one way: the
// composition imports both, neither imports the other.
package pool

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
)

// MaxSize bounds one pool's size (members).
const MaxSize = 64

// fillers bounds how many members are being created at once, across pools,
// so that refilling never starves the host.
const fillers = 2

// maxFailures stops a pool's refilling after that many failed fills in a
// row, until the next tick (every 5 s) allows one more try.
const maxFailures = 5

// Core is what the pools need of the lifecycle core. Its methods are safe
// for concurrent use.
type Core interface {
	// Normalize applies the create defaults and bounds to spec in place;
	// ErrInvalidArgument (a FieldError naming the field) when out of bounds.
	Normalize(spec *node.CreateSpec) error
	// CheckTemplate returns nil when template name is installed,
	// ErrNotFound when it is not, another error when it cannot be read.
	CheckTemplate(name string) error
	// DefaultDriver names the isolation driver members run on.
	DefaultDriver() string
	// Launch makes a new member for the normalized spec, in state pooled
	// and owned by no tenant, and returns its session id. On failure
	// nothing of it is left.
	Launch(ctx context.Context, spec node.CreateSpec) (id string, err error)
	// Adopt turns member id into the running session spec asks for, owned
	// by ctx's caller, with the create's idempotency key and request
	// hash. A FieldError when spec proved wrong for it (an unknown user
	// or workdir); another error when the member failed.
	Adopt(ctx context.Context, id string, spec node.CreateSpec, idempotencyKey, hash string) (*node.Session, error)
	// Discard tears member id down (reason deleted, with detail why).
	Discard(ctx context.Context, id, why string) error
	// LaunchSpare makes a spare: a started sandbox with no files of its
	// own yet, which a create from any template or snapshot can take, in
	// state pooled and owned by no tenant. On failure nothing of it is
	// left.
	LaunchSpare(ctx context.Context) (id string, err error)
}

// spareKey is the key of the spares among the pools (no template has an
// empty name).
const spareKey = ""

// Options configure Pools.
type Options struct {
	// Core launches, adopts and discards members.
	Core Core
	// Store keeps the pool configuration across restarts.
	Store *store.Store
	// Log is where member failures go; nil: slog.Default().
	Log *slog.Logger
	// Spares is how many spares to keep ready (0: none), at most MaxSize.
	Spares int
}

// Pools are the warm pools of one host. They are safe for concurrent use.
type Pools struct {
	core  Core
	store *store.Store
	log   *slog.Logger

	mu    sync.Mutex
	pools map[string]*pool // by template
	// halted: Halt was called; no member is made any more (under mu).
	halted bool
	// spareChanged is closed (and replaced) when a spare fill ends, for
	// AwaitSpare (under mu; nil when nobody waits).
	spareChanged chan struct{}

	kick      chan struct{}
	closing   chan struct{}
	closeOnce sync.Once
	// wg counts the refiller, members being made and members being torn
	// down; Close waits for them.
	wg sync.WaitGroup
}

// pool is one template's warm pool. Guarded by Pools.mu.
type pool struct {
	cfg      node.Pool
	ready    []string // member ids, oldest first
	starting int
	failures int // consecutive failed fills, for back-off
	// waiting counts AwaitSpare callers, each counting on one of the
	// members being made.
	waiting int
}

// New returns empty pools; Load reads their configuration and starts
// refilling them.
func New(opts Options) *Pools {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	ps := &Pools{core: opts.Core, store: opts.Store, log: log, pools: map[string]*pool{},
		kick: make(chan struct{}, 1), closing: make(chan struct{})}
	if n := min(opts.Spares, MaxSize); n > 0 {
		ps.pools[spareKey] = &pool{cfg: node.Pool{Size: n}}
	}
	return ps
}

// SetPool sets the size (and member limits) of template p.Template's pool
// and stores it: Size 0 empties it. Zero limits take the create defaults.
// Members beyond a new, smaller size, and all members when the limits
// change, are torn down. ErrInvalidArgument for a size outside 0..MaxSize,
// limits out of bounds or a template that does not exist.
func (ps *Pools) SetPool(ctx context.Context, p node.Pool) (node.PoolStatus, error) {
	if p.Size < 0 || p.Size > MaxSize {
		return node.PoolStatus{}, errdefs.InvalidField("size", "must be between 0 and %d", MaxSize)
	}
	spec := node.CreateSpec{Template: p.Template, CPU: p.CPU, MemoryMB: p.MemoryMB, Pids: p.Pids, DiskMB: p.DiskMB}
	if err := ps.core.Normalize(&spec); err != nil {
		return node.PoolStatus{}, err
	}
	if err := ps.core.CheckTemplate(spec.Template); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return node.PoolStatus{}, errdefs.InvalidField("template", "template %q does not exist", spec.Template)
		}
		return node.PoolStatus{}, err
	}
	cfg := node.Pool{Template: poolKey(spec), Size: p.Size, CPU: spec.CPU, MemoryMB: spec.MemoryMB, Pids: spec.Pids, DiskMB: spec.DiskMB}
	if err := ps.store.PutPool(ctx, &cfg); err != nil {
		return node.PoolStatus{}, err
	}
	ps.mu.Lock()
	pl := ps.pools[cfg.Template]
	if pl == nil {
		pl = &pool{}
		ps.pools[cfg.Template] = pl
	}
	var drop []string
	if !sameLimits(pl.cfg, cfg) {
		// Members made for other limits no longer fit.
		drop, pl.ready = pl.ready, nil
	}
	pl.cfg = cfg
	if len(pl.ready) > cfg.Size {
		drop = append(drop, pl.ready[cfg.Size:]...)
		pl.ready = pl.ready[:cfg.Size]
	}
	pl.failures = 0
	view := pl.status()
	ps.mu.Unlock()
	ps.discard(drop, "warm pool shrank")
	ps.wake()
	return view, nil
}

// PoolList reports every pool with its depth (ready and starting
// members), by template name.
func (ps *Pools) PoolList() []node.PoolStatus {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]node.PoolStatus, 0, len(ps.pools))
	for key, pl := range ps.pools {
		if key != spareKey {
			out = append(out, pl.status())
		}
	}
	slices.SortFunc(out, func(a, b node.PoolStatus) int { return strings.Compare(a.Template, b.Template) })
	return out
}

// SpareLabel is the template label of the spares in PoolDepths (no
// template can be named so).
const SpareLabel = "(spare)"

// PoolDepths counts ready members by template, and the ready spares
// under SpareLabel when there are spares (metrics.Source).
func (ps *Pools) PoolDepths() map[string]int {
	out := map[string]int{}
	for _, p := range ps.PoolList() {
		out[p.Template] = p.Ready
	}
	ps.mu.Lock()
	if pl := ps.pools[spareKey]; pl != nil {
		out[SpareLabel] = len(pl.ready)
	}
	ps.mu.Unlock()
	return out
}

func (pl *pool) status() node.PoolStatus {
	return node.PoolStatus{Pool: pl.cfg, Ready: len(pl.ready), Starting: pl.starting}
}

// Drop forgets template's pool (its template is going away), tears its
// ready members down and stores its size as 0.
func (ps *Pools) Drop(template string) {
	ps.mu.Lock()
	pl := ps.pools[template]
	delete(ps.pools, template)
	ps.mu.Unlock()
	if pl != nil {
		ps.discard(pl.ready, "template deleted")
		_ = ps.store.PutPool(context.Background(), &node.Pool{Template: template})
	}
}

// sameLimits reports whether members made for a fit pool b.
func sameLimits(a, b node.Pool) bool {
	return a.Template == b.Template && a.CPU == b.CPU && a.MemoryMB == b.MemoryMB && a.Pids == b.Pids && a.DiskMB == b.DiskMB
}

// fits reports whether a create for spec can take a member of cfg.
func fits(cfg node.Pool, spec node.CreateSpec) bool {
	return spec.Snapshot == "" && spec.Network == nil && poolKey(spec) == cfg.Template && spec.CPU == cfg.CPU &&
		spec.MemoryMB == cfg.MemoryMB && spec.Pids == cfg.Pids && spec.DiskMB == cfg.DiskMB
}

// poolKey is the pool a normalized spec's members are in: its template's,
// or the alias's it named (code-interpreter-v1's members are base
// sessions whose kernel is warm: a pool of their own).
func poolKey(spec node.CreateSpec) string {
	if spec.Alias != "" {
		return spec.Alias
	}
	return spec.Template
}

// Claim turns a ready member fitting the normalized spec into the session
// spec asks for. It returns nil (and no error) when no member fits, so
// that the caller makes a sandbox the slow way; an error only for a
// request the member proved wrong (a FieldError: an unknown user or
// workdir). A member that fails otherwise is torn down and the next one
// tried.
func (ps *Pools) Claim(ctx context.Context, spec node.CreateSpec, idempotencyKey, hash string) (*node.Session, error) {
	if spec.Isolation != ps.core.DefaultDriver() {
		return nil, nil // members run on the default driver
	}
	for {
		ps.mu.Lock()
		pl := ps.pools[poolKey(spec)]
		if pl == nil || !fits(pl.cfg, spec) || len(pl.ready) == 0 {
			ps.mu.Unlock()
			return nil, nil
		}
		id := pl.ready[0]
		pl.ready = pl.ready[1:]
		ps.mu.Unlock()
		ps.wake()
		rec, err := ps.core.Adopt(ctx, id, spec, idempotencyKey, hash)
		if err == nil {
			return rec, nil
		}
		ps.discard([]string{id}, "claim failed: "+err.Error())
		var fe *errdefs.FieldError
		if errors.As(err, &fe) {
			return nil, err
		}
		ps.log.Warn("warm-pool member failed; trying another", "session", id, "err", err)
	}
}

// TakeSpare hands out the oldest ready spare's id, which is never handed
// out again (the refiller makes another); "" when none is ready.
func (ps *Pools) TakeSpare() string {
	ps.mu.Lock()
	pl := ps.pools[spareKey]
	if pl == nil || len(pl.ready) == 0 {
		ps.mu.Unlock()
		return ""
	}
	id := pl.ready[0]
	pl.ready = pl.ready[1:]
	ps.mu.Unlock()
	ps.wake()
	return id
}

// Spares reports the spares ready and being made.
func (ps *Pools) Spares() (ready, starting int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if pl := ps.pools[spareKey]; pl != nil {
		return len(pl.ready), pl.starting
	}
	return 0, 0
}

// Halt stops refilling for good: no member is made from now on, and one
// being made is torn down when it is ready. The ready members are
// forgotten, not torn down: a caller that halts the pools tears down every
// sandbox of the host itself (StopAll). The pool sizes stay stored (the
// next daemon refills them).
func (ps *Pools) Halt() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.halted = true
	for _, pl := range ps.pools {
		pl.ready = nil
	}
}

// Filling reports whether a member is being made.
func (ps *Pools) Filling() bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, pl := range ps.pools {
		if pl.starting > 0 {
			return true
		}
	}
	return false
}
