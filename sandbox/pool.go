package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/forkbox/forkbox/agent"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// Warm pools: per template, a number of sandboxes created ahead of time and
// kept ready (state pooled, invisible to users). A create that asks for
// the pool's template and limits, without a snapshot, takes the oldest
// ready member: the session's environment, user and workdir are handed to
// its agent (envd's /init), its record becomes the session's, and it runs.
// A member is used once and never returned; the refiller replaces it in
// the background. Members that fail are torn down and replaced.

// maxPoolSize bounds one pool.
const maxPoolSize = 64

// poolFillers bounds how many members are being created at once, across
// pools, so that refilling never starves the host.
const poolFillers = 2

// maxFillFailures stops a pool's refilling after that many failures in a
// row, until the next tick (every 5 s) allows one more try.
const maxFillFailures = 5

// pool is one template's warm pool. Guarded by Manager.poolMu.
type pool struct {
	cfg      node.Pool
	ready    []*Sandbox // oldest first
	starting int
	failures int // consecutive failed fills, for back-off
}

// SetPool sets the size (and member limits) of template's pool: Size 0
// empties it. Zero limits take the create defaults. Members beyond a new,
// smaller size are torn down.
func (m *Manager) SetPool(ctx context.Context, p node.Pool) (node.PoolStatus, error) {
	if p.Size < 0 || p.Size > maxPoolSize {
		return node.PoolStatus{}, errdefs.InvalidField("size", "must be between 0 and %d", maxPoolSize)
	}
	req := node.CreateSpec{Template: p.Template, CPU: p.CPU, MemoryMB: p.MemoryMB, Pids: p.Pids, DiskMB: p.DiskMB}
	if err := normalizeCreate(&req, m.opts.Limits); err != nil {
		return node.PoolStatus{}, err
	}
	if _, err := storage.LoadTemplate(m.opts.Layout.Template(req.Template)); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return node.PoolStatus{}, errdefs.InvalidField("template", "template %q does not exist", req.Template)
		}
		return node.PoolStatus{}, err
	}
	cfg := node.Pool{Template: req.Template, Size: p.Size, CPU: req.CPU, MemoryMB: req.MemoryMB, Pids: req.Pids, DiskMB: req.DiskMB}
	if err := m.opts.Store.PutPool(ctx, &cfg); err != nil {
		return node.PoolStatus{}, err
	}
	m.poolMu.Lock()
	pl := m.pools[cfg.Template]
	if pl == nil {
		pl = &pool{}
		m.pools[cfg.Template] = pl
	}
	var drop []*Sandbox
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
	view := poolView(pl)
	m.poolMu.Unlock()
	m.discard(drop, "warm pool shrank")
	m.kickPools()
	return view, nil
}

// PoolList reports every pool with its depth, by template name.
func (m *Manager) PoolList() []node.PoolStatus {
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	out := make([]node.PoolStatus, 0, len(m.pools))
	for _, pl := range m.pools {
		out = append(out, poolView(pl))
	}
	sortPools(out)
	return out
}

func poolView(pl *pool) node.PoolStatus {
	return node.PoolStatus{Pool: pl.cfg, Ready: len(pl.ready), Starting: pl.starting}
}

func sortPools(ps []node.PoolStatus) {
	slices.SortFunc(ps, func(a, b node.PoolStatus) int { return strings.Compare(a.Template, b.Template) })
}

// dropPool forgets template's pool (its template is going away) and tears
// its members down.
func (m *Manager) dropPool(template string) {
	m.poolMu.Lock()
	pl := m.pools[template]
	delete(m.pools, template)
	m.poolMu.Unlock()
	if pl != nil {
		m.discard(pl.ready, "template deleted")
		_ = m.opts.Store.PutPool(context.Background(), &node.Pool{Template: template})
	}
}

// sameLimits reports whether members made for a fit pool b.
func sameLimits(a, b node.Pool) bool {
	return a.Template == b.Template && a.CPU == b.CPU && a.MemoryMB == b.MemoryMB && a.Pids == b.Pids && a.DiskMB == b.DiskMB
}

// fits reports whether a create for req can take a member of cfg.
func fits(cfg node.Pool, req node.CreateSpec) bool {
	return req.Snapshot == "" && req.Template == cfg.Template && req.CPU == cfg.CPU &&
		req.MemoryMB == cfg.MemoryMB && req.Pids == cfg.Pids && req.DiskMB == cfg.DiskMB
}

// claim turns a ready member fitting req into the session req asks for. It
// returns nil (and no error) when no member fits, so that the caller makes
// a sandbox the slow way; an error only for a request the member proved
// wrong (an unknown user or workdir).
func (m *Manager) claim(ctx context.Context, req node.CreateSpec, idempotencyKey, hash string) (*node.Session, error) {
	if req.Isolation != m.DefaultDriver().Name() {
		return nil, nil // members run on the default driver
	}
	for {
		m.poolMu.Lock()
		pl := m.pools[req.Template]
		if pl == nil || !fits(pl.cfg, req) || len(pl.ready) == 0 {
			m.poolMu.Unlock()
			return nil, nil
		}
		sb := pl.ready[0]
		pl.ready = pl.ready[1:]
		m.poolMu.Unlock()
		m.kickPools()
		rec, err := m.adoptMember(ctx, sb, req, idempotencyKey, hash)
		if err == nil {
			return rec, nil
		}
		var fe *errdefs.FieldError
		m.discard([]*Sandbox{sb}, "claim failed: "+err.Error())
		if errors.As(err, &fe) {
			return nil, err
		}
		m.log.Warn("warm-pool member failed; trying another", "session", sb.id, "err", err)
	}
}

// adoptMember configures member sb for req and makes it a running session.
func (m *Manager) adoptMember(ctx context.Context, sb *Sandbox, req node.CreateSpec, idempotencyKey, hash string) (*node.Session, error) {
	// What the member used while it waited is nobody's: mark it counted.
	if st, err := m.sample(ctx, sb); err == nil {
		_, _ = m.opts.Store.AddSessionCPU(ctx, sb.id, "", int64(st.CPUSeconds*1000), time.Now())
	}
	if err := m.initAgent(ctx, sb, req); err != nil {
		return nil, err
	}
	if err := m.checkDefaults(ctx, sb, req); err != nil {
		return nil, err
	}
	rec, err := m.save(ctx, sb, func(r *node.Session) error {
		if sb.tearing || r.State != node.StatePooled {
			return errdefs.Newf(errdefs.ErrConflict, "pool member %s is %s", sb.id, r.State)
		}
		now := time.Now().UTC()
		r.State = node.StateRunning
		r.DefaultUser, r.Workdir, r.Env, r.Metadata = req.User, req.Workdir, req.Env, req.Metadata
		r.TimeoutS, r.AutoPauseS = req.TimeoutS, req.AutoPauseS
		r.OnTimeout, r.AutoResume = req.OnTimeout, req.AutoResume
		r.IdempotencyKey, r.RequestHash = idempotencyKey, hash
		r.Tenant = callerTenant(ctx)
		sb.res = reservationOf(ctx)
		r.StartedAt, r.ExpiresAt = now, now.Add(time.Duration(req.TimeoutS)*time.Second)
		sb.lastUse = now
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.arm(sb)
	m.armIdle(sb)
	m.log.Info("session from warm pool", "session", sb.id, "template", req.Template)
	return &rec, nil
}

// initAgent gives sb's running agent req's environment, default user and
// working directory (POST /init).
func (m *Manager) initAgent(ctx context.Context, sb *Sandbox, req node.CreateSpec) error {
	return sb.agent.Init(ctx, agent.InitRequest{EnvVars: req.Env, DefaultUser: req.User, DefaultWorkdir: req.Workdir})
}

// discard tears members down in the background; Close waits for it.
func (m *Manager) discard(members []*Sandbox, why string) {
	for _, sb := range members {
		m.wg.Add(1) // Close waits for these
		go func(sb *Sandbox) {
			defer m.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_ = m.teardown(ctx, sb, node.ReasonDeleted, why)
		}(sb)
	}
}

// kickPools wakes the refiller.
func (m *Manager) kickPools() {
	select {
	case m.poolKick <- struct{}{}:
	default:
	}
}

// loadPools reads the pool configuration and starts the refiller.
func (m *Manager) loadPools(ctx context.Context) error {
	cfgs, err := m.opts.Store.ListPools(ctx)
	if err != nil {
		return err
	}
	m.poolMu.Lock()
	for _, c := range cfgs {
		if c.Size > 0 {
			m.pools[c.Template] = &pool{cfg: *c}
		}
	}
	m.poolMu.Unlock()
	m.wg.Add(1)
	go m.refill()
	m.kickPools()
	return nil
}

// refill keeps every pool at its size until Close.
func (m *Manager) refill() {
	defer m.wg.Done()
	sem := make(chan struct{}, poolFillers)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-m.poolKick:
		case <-tick.C:
			// A pool that kept failing gets one more try per tick.
			m.poolMu.Lock()
			for _, pl := range m.pools {
				pl.failures = min(pl.failures, maxFillFailures-1)
			}
			m.poolMu.Unlock()
		}
		m.poolMu.Lock()
		for _, pl := range m.pools {
			for pl.starting+len(pl.ready) < pl.cfg.Size && pl.failures < maxFillFailures && !m.poolsStopped {
				select {
				case sem <- struct{}{}:
				default:
					goto full
				}
				pl.starting++
				m.wg.Add(1) // Close waits for members being made
				go func(pl *pool, cfg node.Pool) {
					defer m.wg.Done()
					defer func() { <-sem }()
					m.fillOne(pl, cfg)
				}(pl, pl.cfg)
			}
		}
	full:
		m.poolMu.Unlock()
	}
}

// fillOne makes one member for pool pl (configured as cfg) and adds it,
// unless the pool no longer wants it.
func (m *Manager) fillOne(pl *pool, cfg node.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req := node.CreateSpec{Template: cfg.Template, CPU: cfg.CPU, MemoryMB: cfg.MemoryMB, Pids: cfg.Pids, DiskMB: cfg.DiskMB,
		Isolation: m.DefaultDriver().Name()}
	err := normalizeCreate(&req, m.opts.Limits)
	var rec *node.Session
	if err == nil {
		rec, err = m.launch(ctx, req, "", "", node.StatePooled, node.StatePooled)
	}
	m.poolMu.Lock()
	pl.starting--
	if err != nil {
		pl.failures++
		m.poolMu.Unlock()
		m.log.Error("warm-pool member failed to start", "template", cfg.Template, "err", err)
		return
	}
	pl.failures = 0
	sb := m.lookup(rec.ID)
	select {
	case <-m.closing:
		// Shutting down: the member stays, as the ready ones do, for the
		// next daemon to tear down.
		m.poolMu.Unlock()
		return
	default:
	}
	if sb != nil && !m.poolsStopped && m.pools[cfg.Template] == pl && sameLimits(pl.cfg, cfg) && len(pl.ready) < pl.cfg.Size {
		pl.ready = append(pl.ready, sb)
		sb = nil
	}
	m.poolMu.Unlock()
	if sb != nil {
		m.discard([]*Sandbox{sb}, "warm pool no longer needs it")
	}
	m.kickPools()
}
