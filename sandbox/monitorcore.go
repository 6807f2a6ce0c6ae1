package sandbox

import (
	"context"

	"github.com/forkbox/forkbox/monitor"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// monitorCore is the manager as the monitor sees it (monitor.Core): the
// sandboxes to sample and the way to end one. It hands out *Sandbox
// values only, and takes back only those.
type monitorCore struct{ m *Manager }

var _ monitor.Core = monitorCore{}

// Running lists the running sandboxes of a tenant with no teardown under
// way.
func (c monitorCore) Running() []monitor.Sandbox {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	out := make([]monitor.Sandbox, 0, len(c.m.live))
	for _, sb := range c.m.live {
		sb.mu.Lock()
		if sb.rec.State == node.StateRunning && !sb.tearing && sb.rec.Tenant != "" {
			out = append(out, sb)
		}
		sb.mu.Unlock()
	}
	return out
}

// Live lists tenant's running or paused sandboxes.
func (c monitorCore) Live(tenant string) []monitor.Sandbox {
	sbs := c.m.tenants.sandboxesOf(tenant, isLive)
	out := make([]monitor.Sandbox, len(sbs))
	for i, sb := range sbs {
		out[i] = sb
	}
	return out
}

// Driver returns the driver sb runs on.
func (c monitorCore) Driver(sb monitor.Sandbox) runtime.Driver {
	return c.m.runtimes.driverOf(sb.(*Sandbox))
}

// End tears sb down with reason and detail.
func (c monitorCore) End(ctx context.Context, sb monitor.Sandbox, reason, detail string) error {
	return c.m.teardown(ctx, sb.(*Sandbox), reason, detail)
}

// CheckDead ends sandbox id if it stopped by itself.
func (c monitorCore) CheckDead(ctx context.Context, id string) error {
	return c.m.cmds.checkDead(ctx, id)
}

// ID returns the sandbox's session id.
func (s *Sandbox) ID() string { return s.id }

// ClaimAbuse marks s as being ended for abuse and reports whether this
// call was the first to (monitor.Sandbox).
func (s *Sandbox) ClaimAbuse() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := !s.abused
	s.abused = true
	return first
}
