// Package host composes what one host offers into the Node the daemon
// serves: the lifecycle core (package sandbox) with the concerns around it
// (warm pools: package pool). It is wiring only: each concern depends on a
// small interface of the core, the core on a small interface of each
// (sandbox.WarmPools), and only this package imports both sides.
package host

import (
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/pool"
	"github.com/forkbox/forkbox/sandbox"
)

// Node is one host's node.Node: the core's methods and those of the
// concerns composed with it, promoted from the embedded values. It is
// safe for concurrent use.
type Node struct {
	*sandbox.Manager
	*pool.Pools
}

var _ node.Node = (*Node)(nil)

// New makes the core for opts and composes the concerns with it. Call
// Recover before serving requests and Close when done.
func New(opts sandbox.Options) *Node {
	m := sandbox.NewManager(opts)
	p := pool.New(pool.Options{Core: m.PoolCore(), Store: opts.Store, Log: opts.Log})
	m.UseWarmPools(p)
	return &Node{Manager: m, Pools: p}
}

// Close stops the concerns first (the warm pools' refiller and the members
// being made, which use the core), then the core. Safe to call more than
// once.
func (n *Node) Close() {
	n.Pools.Close()
	n.Manager.Close()
}
