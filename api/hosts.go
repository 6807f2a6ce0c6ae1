package api

import (
	"context"
	"net/http"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
)

// HostLister lists the fleet's hosts (the daemon's fleet registry).
type HostLister interface {
	// Self is this host's fleet id.
	Self() string
	// Hosts lists every host's record (fleet.Registry.List); ErrUnavailable
	// while the registry cannot be read.
	Hosts(ctx context.Context) ([]fleet.Host, error)
}

// SetHosts gives GET /v1/hosts its source. Call it before serving; until
// then (and with nil) the route answers 503.
func (s *Server) SetHosts(h HostLister) { s.hostsAPI.hosts = h }

// hostsAPI serves the fleet's hosts (admin only).
type hostsAPI struct {
	edge
	hosts HostLister
}

// handleHosts: GET /v1/hosts → every host of the fleet, with its
// capacity, load, version and state.
func (h *hostsAPI) handleHosts(w http.ResponseWriter, r *http.Request) {
	if h.hosts == nil {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrUnavailable, "this daemon has no fleet registry"))
		return
	}
	hosts, err := h.hosts.Hosts(r.Context())
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.HostList{Self: h.hosts.Self(), Hosts: make([]v1.Host, 0, len(hosts))}
	for _, x := range hosts {
		out.Hosts = append(out.Hosts, v1.Host{
			ID: x.ID, API: x.API, Version: x.Version, Tiers: x.Tiers,
			MemoryMB: x.Capacity.MemoryMB, CPUs: x.Capacity.CPUs, SessionSlots: x.Capacity.Sessions,
			Sessions: x.Load.Sessions, State: string(x.State), Placeable: x.Placeable,
			Heartbeat: x.Heartbeat.UTC(), Started: x.Started.UTC(),
		})
	}
	writeJSON(w, http.StatusOK, out)
}
