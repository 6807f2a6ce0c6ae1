package sandbox

import (
	"strings"

	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// Runtimes owns this host's isolation drivers and create limits: which
// drivers there are and which is the default, the one a session runs on,
// a create's choice of driver, how long a create waits for a new
// sandbox's agent on each, and the resource limits of sandbox processes.
// It reads only the Manager's options, which do not change.
type Runtimes struct{ m *Manager }

// Drivers returns the isolation drivers this host has.
func (rt *Runtimes) Drivers() []runtime.Driver { return rt.m.opts.Drivers }

// DefaultDriver returns the driver of sessions that pick none.
func (rt *Runtimes) DefaultDriver() runtime.Driver {
	if d := rt.driver(rt.m.opts.DefaultDriver); d != nil {
		return d
	}
	return rt.m.opts.Drivers[0]
}

// driver returns the driver named name, or nil.
func (rt *Runtimes) driver(name string) runtime.Driver {
	for _, d := range rt.m.opts.Drivers {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// driverOf returns the driver sb runs on (the default one for a record
// that names a driver this host no longer has: its calls then fail with
// not-found, which ends the session).
func (rt *Runtimes) driverOf(sb *Sandbox) runtime.Driver {
	sb.mu.Lock()
	name := sb.rec.Driver
	sb.mu.Unlock()
	if d := rt.driver(name); d != nil {
		return d
	}
	return rt.DefaultDriver()
}

// Limits returns the bounds applied to create requests.
func (rt *Runtimes) Limits() node.Limits { return rt.m.opts.Limits }

// Info says which drivers this host has (with their capabilities by the
// REST API's names), the default one and the create limits.
func (rt *Runtimes) Info() node.Info {
	info := node.Info{DefaultDriver: rt.DefaultDriver().Name(), Limits: rt.m.opts.Limits}
	for _, d := range rt.m.opts.Drivers {
		c := d.Capabilities()
		di := node.DriverInfo{Name: d.Name(), Capabilities: map[string]bool{
			"pause": c.Pause, "memory_snapshot": c.MemorySnapshot, "fork": c.Fork, "user_namespace": c.UserNamespace,
			"sandbox_oom": c.SandboxOOM, "network": c.Network, "join_user_namespace": c.JoinUserNamespace,
		}}
		if v, ok := d.(runtime.Versioner); ok {
			di.Version = v.Version()
		}
		info.Drivers = append(info.Drivers, di)
	}
	return info
}

// pickDriver sets req.Isolation to the server's default when empty and
// refuses a driver this host does not have.
func (rt *Runtimes) pickDriver(req *node.CreateSpec) error {
	if req.Isolation == "" {
		req.Isolation = rt.DefaultDriver().Name()
	}
	if rt.driver(req.Isolation) == nil {
		names := make([]string, 0, len(rt.m.opts.Drivers))
		for _, d := range rt.m.opts.Drivers {
			names = append(names, d.Name())
		}
		return errdefs.InvalidField("isolation", "must be one of %s (the drivers this host has)", strings.Join(names, ", "))
	}
	if req.Network != nil && !rt.driver(req.Isolation).Capabilities().Network {
		return errdefs.InvalidField("network", "isolation %q cannot have a network yet", req.Isolation)
	}
	return nil
}

// rlimits are the resource limits of every sandbox process: the open-file
// limit of m's Limits and no core dumps (a core file of a large process
// would fill the sandbox's disk and could hold secrets).
func (rt *Runtimes) rlimits() runtime.Rlimits {
	n := rt.m.opts.Limits.OpenFilesPerProcess
	if n == 0 {
		n = defaults.ProcessOpenFiles()
	}
	return runtime.Rlimits{
		{Resource: "RLIMIT_NOFILE", Soft: n, Hard: n},
		{Resource: "RLIMIT_CORE", Soft: 0, Hard: 0},
	}
}
