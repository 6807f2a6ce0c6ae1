package daemon

import (
	"context"
	"log/slog"
	"net/http"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/route"
	"github.com/forkbox/forkbox/store"
)

// fleetRouting is the daemon's part of routing between the fleet's
// hosts (package route): the Node that keeps the directory and the
// router in front of the API. Off for a host alone, and with --nats but
// no --fleet-secret-file (no key to sign forwarded requests with).
type fleetRouting struct {
	tracked *route.Tracked
	router  *route.Router
	stop    context.CancelFunc
	done    chan struct{}
}

// routing returns the routing of fh over n, or nil when it is off
// (logged for --nats without a secret).
func (fh *fleetHost) routing(n node.Node, opts FleetOptions, log *slog.Logger) *fleetRouting {
	if !fh.f.Clustered() && opts.NATS.URL == "" {
		return nil
	}
	if opts.NATS.Secret == "" {
		log.Warn("fleet: routing between hosts is off: --nats needs --fleet-secret-file to sign forwarded requests")
		return nil
	}
	return &fleetRouting{tracked: route.NewTracked(n, fh.Self(), fh.directory, log)}
}

// handler returns the router in front of local (the API server), and
// starts the directory's sync until stop.
func (fr *fleetRouting) handler(fh *fleetHost, opts FleetOptions, local http.Handler, st *store.Store, domain string, log *slog.Logger) http.Handler {
	ctx, cancel := context.WithCancel(context.Background())
	fr.stop, fr.done = cancel, make(chan struct{})
	go func() { defer close(fr.done); fr.tracked.Run(ctx, 0) }()
	fr.router = route.New(route.Options{Self: fh.Self(), Local: local, Key: route.DeriveKey(opts.NATS.Secret),
		Directory: fh.directory, Hosts: fh.viewHosts, Keys: st, Domain: domain, Log: log, Holds: fr.holds})
	return fr.router
}

// migrate is the API's api.Migrator: route.Router.Migrate of a session
// of this host's tracked node (so the directory follows).
func (fr *fleetRouting) migrate(ctx context.Context, id, host string) (*v1.Session, error) {
	return fr.router.Migrate(ctx, fr.tracked, id, host)
}

// holds reports whether this host has kind's id live: a session in any
// state but terminated, or a snapshot (read with forkbox's own context,
// which sees every tenant's).
func (fr *fleetRouting) holds(ctx context.Context, kind fleet.Kind, id string) bool {
	ctx = context.WithoutCancel(ctx)
	switch kind {
	case fleet.KindSession:
		s, err := fr.tracked.Node.Get(ctx, id)
		return err == nil && s.State != node.StateTerminated
	case fleet.KindSnapshot:
		sn, err := fr.tracked.Node.GetSnapshot(ctx, id)
		return err == nil && sn.ID == id
	}
	return false
}

// close stops the directory's sync (before the Node closes).
func (fr *fleetRouting) close() {
	if fr != nil && fr.stop != nil {
		fr.stop()
		<-fr.done
	}
}
