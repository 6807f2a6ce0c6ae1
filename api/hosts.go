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
	// Drain sets (on) or clears host id's drain flag
	// (fleet.Registry.Drain): ErrNotFound for a host not in the registry,
	// ErrUnavailable while it cannot be written.
	Drain(ctx context.Context, id string, on bool) error
}

// SetEnded gives GET /v1/sessions/{id} the fleet's word on a session this
// host does not hold: ended is called with the id when the host answers
// not found, and a non-nil error it returns is the answer instead (the
// daemon's: ErrTerminated with reason host-lost for a session of a lost
// host, per the fleet's directory, fleet.Directory.Ended). Call it before
// serving.
func (s *Server) SetEnded(ended func(ctx context.Context, id string) error) { s.sessions.ended = ended }

// SetHosts gives GET /v1/hosts its source. Call it before serving; until
// then (and with nil) the route answers 503.
func (s *Server) SetHosts(h HostLister) { s.hostsAPI.hosts, s.sessions.self.id = h, h.Self }

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
		out.Hosts = append(out.Hosts, hostView(x))
	}
	writeJSON(w, http.StatusOK, out)
}

func hostView(x fleet.Host) v1.Host {
	return v1.Host{
		ID: x.ID, API: x.API, Version: x.Version, Tiers: x.Tiers,
		MemoryMB: x.Capacity.MemoryMB, CPUs: x.Capacity.CPUs, SessionSlots: x.Capacity.Sessions,
		Sessions: x.Load.Sessions, Pooled: x.Load.Pooled, State: string(x.State), Placeable: x.Placeable,
		Heartbeat: x.Heartbeat.UTC(), Started: x.Started.UTC(),
	}
}

// handleDrain: POST /v1/hosts/{id}/drain → the host's record, draining:
// it takes no placements; its sessions run on until they end.
func (h *hostsAPI) handleDrain(w http.ResponseWriter, r *http.Request) { h.drain(w, r, true) }

// handleUndrain: POST /v1/hosts/{id}/undrain → the host's record, ready
// again (unless it is lost).
func (h *hostsAPI) handleUndrain(w http.ResponseWriter, r *http.Request) { h.drain(w, r, false) }

func (h *hostsAPI) drain(w http.ResponseWriter, r *http.Request, on bool) {
	if h.hosts == nil {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrUnavailable, "this daemon has no fleet registry"))
		return
	}
	id := r.PathValue("id")
	if err := fleet.ValidID("host id", id); err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := h.hosts.Drain(r.Context(), id, on); err != nil {
		h.writeError(w, r, err)
		return
	}
	hosts, err := h.hosts.Hosts(r.Context())
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	for _, x := range hosts {
		if x.ID == id {
			writeJSON(w, http.StatusOK, hostView(x))
			return
		}
	}
	h.writeError(w, r, errdefs.Newf(errdefs.ErrNotFound, "host %s is not in the fleet's registry", id))
}
