// Package host composes what one host offers into the Node the daemon
// serves: the lifecycle core (package sandbox) with the concerns around it
// (warm pools: package pool; snapshots, fork and memory checkpoints:
// package snapshot). It is wiring only. Each concern depends on a small
// interface of the core that it declares itself (pool.Core,
// snapshot.Core), the core on a small interface of each that it declares
// (sandbox.WarmPools, sandbox.SnapshotHooks), and only this package imports
// both sides, so imports run one way.
package host

import (
	"context"

	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/pool"
	"github.com/forkbox/forkbox/sandbox"
	"github.com/forkbox/forkbox/snapshot"
	"github.com/forkbox/forkbox/volume"
)

// Node is one host's node.Node: the core's methods and those of the
// concerns composed with it, promoted from the embedded values. It is
// safe for concurrent use.
type Node struct {
	*sandbox.Manager
	// The core's concerns (sandbox.Concerns): files, commands, metering,
	// templates, tenants, start-up recovery and the isolation drivers.
	*sandbox.Files
	*sandbox.Commands
	*sandbox.Meter
	*sandbox.Templates
	*sandbox.Tenants
	*sandbox.Recovery
	*sandbox.Runtimes
	*pool.Pools
	*snapshot.Service
	*volume.API
}

var _ node.Node = (*Node)(nil)

// Options are the host's settings beyond the core's.
type Options struct {
	// Spares is how many spare sandboxes (sandbox.PoolCore.LaunchSpare)
	// the pools keep ready, where the host can make them
	// (sandbox.Manager.SparesSupported); 0: none.
	Spares int
	// Replicas, when set, receives a copy of every sealed memory
	// checkpoint (snapshot.Options.Replicas: the fleet's object store).
	Replicas snapshot.Replicas
}

// New makes the core for opts and composes the concerns with it. Call
// Recover before serving requests and Close when done.
func New(opts sandbox.Options, hopts Options) *Node {
	m := sandbox.NewManager(opts)
	spares := hopts.Spares
	if spares > 0 && !m.SparesSupported() {
		if opts.Log != nil {
			opts.Log.Info("no spare sandboxes: they need the runc tier, host ids of their own and btrfs storage")
		}
		spares = 0
	}
	p := pool.New(pool.Options{Core: m.PoolCore(), Store: opts.Store, Log: opts.Log, Spares: spares})
	sc := &snapshotCore{SnapshotCore: m.SnapshotCore()}
	s := snapshot.New(snapshot.Options{Core: sc, Store: opts.Store, Storage: opts.Storage,
		Layout: opts.Layout, Key: opts.SnapshotKey, Audit: opts.Audit, Log: opts.Log,
		ImageCacheBytes: opts.MemoryImageCacheBytes, Replicas: hopts.Replicas, Volumes: opts.Volumes})
	m.UseWarmPools(p)
	m.UseSnapshots(s)
	c := m.Concerns()
	sc.cmds = c.Commands
	return &Node{Manager: m, Files: c.Files, Commands: c.Commands, Meter: c.Meter, Templates: c.Templates,
		Tenants: c.Tenants, Recovery: c.Recovery, Runtimes: c.Runtimes, Pools: p, Service: s,
		API: volume.NewAPI(opts.Volumes)}
}

// Close quiesces the core first (no session timer fires and its
// background work stops, so a stopping daemon ends no session the next one
// adopts), then waits for the warm pools (their refiller and the members
// being made, which use the core) and the snapshots' background copies,
// then closes the core. Safe to call more than once.
func (n *Node) Close() {
	n.Manager.Quiesce()
	n.Pools.Close()
	n.Service.Close()
	n.Manager.Close()
}

// snapshotCore gives the core's held sandboxes the snapshot package's
// interface type, and its commands (fork and run).
type snapshotCore struct {
	*sandbox.SnapshotCore
	cmds *sandbox.Commands
}

// Exec runs a command in a session (sandbox.Commands.Exec).
func (c *snapshotCore) Exec(ctx context.Context, id string, spec node.ExecSpec, out node.Output) (*node.ExecResult, error) {
	return c.cmds.Exec(ctx, id, spec, out)
}

// Find is sandbox.SnapshotCore.Find as snapshot.Core asks for it.
func (c *snapshotCore) Find(ctx context.Context, id string) (snapshot.Held, error) {
	h, err := c.SnapshotCore.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	return h, nil
}

var _ snapshot.Core = (*snapshotCore)(nil)
