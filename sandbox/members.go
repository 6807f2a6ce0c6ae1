package sandbox

import (
	"context"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// The core's side of the warm pools (package pool): it launches members in
// state pooled, hands one to a create and tears one down (PoolCore), and
// reaches the pools through WarmPools, which package pool implements.

// WarmPools is what the lifecycle core asks of the warm pools. The
// composition sets it with UseWarmPools; without it there are no pools.
type WarmPools interface {
	// Claim hands a ready member that fits the normalized spec to the
	// create (nil, nil when none fits); an error only when spec proved
	// wrong for the member (a FieldError).
	Claim(ctx context.Context, spec node.CreateSpec, idempotencyKey, hash string) (*node.Session, error)
	// Drop forgets template's pool and tears its members down (the
	// template is going away).
	Drop(template string)
	// Halt stops refilling for good and forgets the ready members (they
	// are live sandboxes of the core, which tears them down itself).
	Halt()
	// Filling reports whether a member is being made.
	Filling() bool
	// Load reads the pool configuration and starts refilling (after
	// Recover has torn down a previous daemon's members).
	Load(ctx context.Context) error
	// TakeSpare hands out the id of a ready spare (spare.go), never to
	// hand it out again; "" when there is none.
	TakeSpare() string
	// AwaitSpare waits (bounded) while no spare is ready but one is
	// being made for the caller; it reports whether one is ready.
	AwaitSpare(ctx context.Context) bool
}

// noPools is the WarmPools of a core without pools.
type noPools struct{}

func (noPools) Claim(context.Context, node.CreateSpec, string, string) (*node.Session, error) {
	return nil, nil
}
func (noPools) Drop(string)                {}
func (noPools) Halt()                      {}
func (noPools) Filling() bool              { return false }
func (noPools) Load(context.Context) error { return nil }
func (noPools) TakeSpare() string          { return "" }

func (noPools) AwaitSpare(context.Context) bool { return false }

var _ WarmPools = noPools{}

// UseWarmPools makes w the pools creates take members from. Call it once,
// before Recover.
func (m *Manager) UseWarmPools(w WarmPools) { m.warm = w }

// PoolCore returns the core as the warm pools need it (pool.Core).
func (m *Manager) PoolCore() *PoolCore { return &PoolCore{m: m} }

// PoolCore launches, adopts and discards warm-pool members for package
// pool. It is safe for concurrent use.
type PoolCore struct{ m *Manager }

// Normalize applies the create defaults and bounds to spec;
// ErrInvalidArgument naming the field when out of bounds.
func (c *PoolCore) Normalize(spec *node.CreateSpec) error {
	if spec.User == "" && spec.Snapshot == "" {
		spec.User = c.m.templateUser(spec.Template) // (as a create of the template has it)
	}
	return normalizeCreate(spec, c.m.opts.Limits)
}

// CheckTemplate returns nil when template name is installed, ErrNotFound
// when it is not.
func (c *PoolCore) CheckTemplate(name string) error {
	_, err := storage.LoadTemplate(c.m.opts.Layout.Template(name))
	return err
}

// DefaultDriver names the driver members run on (the host's default).
func (c *PoolCore) DefaultDriver() string { return c.m.runtimes.DefaultDriver().Name() }

// Launch makes a member for the normalized spec, in state pooled and owned
// by nobody, and returns its id; on failure it is torn down. A member that
// warms the code interpreter (spec.CodeWarm) is ready once its kernel is.
func (c *PoolCore) Launch(ctx context.Context, spec node.CreateSpec) (string, error) {
	rec, err := c.m.launch(ctx, spec, "", "", node.StatePooled, node.StatePooled)
	if err != nil {
		return "", err
	}
	if spec.CodeWarm {
		// A ready member of the code-interpreter template has its kernel
		// ready too.
		sb := c.m.lookup(rec.ID)
		if sb == nil {
			return "", errdefs.Newf(errdefs.ErrUnavailable, "pool member %s is gone", rec.ID)
		}
		if err := sb.agent.WarmCode(ctx); err != nil {
			_ = c.m.teardown(ctx, sb, node.ReasonDeleted, "its code interpreter did not start")
			return "", errdefs.Newf(errdefs.ErrUnavailable, "pool member %s: %v", rec.ID, err)
		}
	}
	return rec.ID, nil
}

// Adopt configures member id for spec and makes it ctx's caller's running
// session. ErrNotFound when the member is gone; ErrConflict when it is no
// longer pooled.
func (c *PoolCore) Adopt(ctx context.Context, id string, spec node.CreateSpec, idempotencyKey, hash string) (*node.Session, error) {
	sb := c.m.lookup(id)
	if sb == nil {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "pool member %s", id)
	}
	return c.m.adoptMember(ctx, sb, spec, idempotencyKey, hash, func() error {
		if err := c.m.initAgent(ctx, sb, spec); err != nil {
			return err
		}
		return c.m.checkDefaults(ctx, sb, spec)
	})
}

// Discard tears member id down with reason deleted and detail why;
// ErrNotFound when it is gone already.
func (c *PoolCore) Discard(ctx context.Context, id, why string) error {
	sb := c.m.lookup(id)
	if sb == nil {
		return errdefs.Newf(errdefs.ErrNotFound, "pool member %s", id)
	}
	return c.m.teardown(ctx, sb, node.ReasonDeleted, why)
}

// adoptMember configures member sb for req with configure (a pool
// member's agent settings, or a spare's files) and makes it a running
// session: the record takes req's settings and limits.
func (m *Manager) adoptMember(ctx context.Context, sb *Sandbox, req node.CreateSpec, idempotencyKey, hash string, configure func() error) (*node.Session, error) {
	// What the member used while it waited is nobody's: mark it counted.
	began := time.Now()
	m.mon.ClearCPU(ctx, sb)
	cleared := time.Now()
	if err := configure(); err != nil {
		return nil, err
	}
	configured := time.Now()
	rec, err := m.save(ctx, sb, func(r *node.Session) error {
		if sb.tearing || r.State != node.StatePooled {
			return errdefs.Newf(errdefs.ErrConflict, "pool member %s is %s", sb.id, r.State)
		}
		now := time.Now().UTC()
		r.State = node.StateRunning
		r.Template, r.Snapshot, r.Driver = req.Template, req.Snapshot, req.Isolation
		r.CPU, r.MemoryMB, r.Pids, r.DiskMB = req.CPU, req.MemoryMB, req.Pids, req.DiskMB
		r.DefaultUser, r.Workdir, r.Env, r.Metadata = req.User, req.Workdir, req.Env, req.Metadata
		r.TimeoutS, r.AutoPauseS = req.TimeoutS, req.AutoPauseS
		r.OnTimeout, r.AutoResume = req.OnTimeout, req.AutoResume
		r.PublicTraffic = req.PublicTraffic
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
	m.log.Debug("member adopted", "session", sb.id, "clear_cpu_ms", ms(cleared.Sub(began)),
		"configure_ms", ms(configured.Sub(cleared)), "save_ms", ms(time.Since(configured)))
	return &rec, nil
}

// initAgent gives sb's running agent req's environment, default user and
// working directory (POST /init), and starts its default Python kernel
// when req asks for it.
func (m *Manager) initAgent(ctx context.Context, sb *Sandbox, req node.CreateSpec) error {
	return sb.agent.Init(ctx, wire.InitRequest{EnvVars: req.Env, DefaultUser: req.User, DefaultWorkdir: req.Workdir, CodeWarm: req.CodeWarm})
}
