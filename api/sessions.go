package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// sessionView is the API view of a session record.
func sessionView(r *node.Session) v1.Session {
	meta := r.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	v := v1.Session{
		ID: r.ID, Template: r.Template, Driver: r.Driver, State: string(r.State), Reason: r.Reason, Detail: r.Detail,
		CPU: r.CPU, MemoryMB: r.MemoryMB, Pids: r.Pids, TimeoutS: r.TimeoutS, User: r.DefaultUser,
		Workdir: r.Workdir, Metadata: meta,
		CreatedAt: timePtr(r.CreatedAt), StartedAt: timePtr(r.StartedAt), ExpiresAt: timePtr(r.ExpiresAt), EndedAt: timePtr(r.EndedAt),
		Snapshot: r.Snapshot, DiskMB: r.DiskMB, AutoPauseS: r.AutoPauseS, PausedAt: timePtr(r.PausedAt),
		OnTimeout: r.OnTimeout, AutoResume: r.AutoResume, Network: apiNetwork(r.Network), Secrets: sessionSecrets(r.Network),
		PublicTraffic: r.PublicTraffic, Volumes: apiVolumeMounts(r.Volumes),
	}
	if v.OnTimeout == "" {
		v.OnTimeout = node.OnTimeoutKill // sessions from before on_timeout existed
	}
	if r.State == node.StatePaused {
		// The timeout clock is stopped: say what is left instead of a date.
		v.ExpiresAt = nil
		v.RemainingS = int64(r.Remaining.Seconds())
	}
	return v
}

// snapshotView is the API view of a snapshot record.
func snapshotView(sn *node.Snapshot) v1.Snapshot {
	return v1.Snapshot{
		ID: sn.ID, SessionID: sn.SessionID, Parent: sn.Parent, Template: sn.Template, Storage: sn.Storage,
		SizeBytes: sn.SizeBytes, Digest: sn.Digest, CreatedAt: sn.CreatedAt, ExpiresAt: timePtr(sn.ExpiresAt),
		Name: sn.Name, Memory: sn.MemoryDriver != "", MemoryDriver: sn.MemoryDriver, MemoryBytes: sn.MemoryBytes,
		MemoryReplicatedAt: timePtr(sn.MemoryReplicatedAt), MemoryState: memoryState(sn),
	}
}

// memoryState is a snapshot's v1.Snapshot.MemoryState.
func memoryState(sn *node.Snapshot) string {
	switch {
	case sn.MemoryDriver == "":
		return ""
	case sn.Sealing():
		return v1.MemorySealing
	default:
		return v1.MemorySealed
	}
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// maxIdempotencyKey bounds the Idempotency-Key header, in bytes.
const maxIdempotencyKey = 255

// handleCreate: POST /v1/sessions. 201 with the session; 200 with the
// original session (and Idempotent-Replayed: true) for a retry carrying the
// same Idempotency-Key and body.
func (h *sessionAPI) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req v1.CreateRequest
	if err := decodeJSON(r, &req, maxJSONBody, true); err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := checkHost(r.Context(), req.Host, h.self.get()); err != nil {
		h.writeError(w, r, err)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if len(key) > maxIdempotencyKey {
		h.writeError(w, r, errdefs.InvalidField("Idempotency-Key", "longer than %d bytes", maxIdempotencyKey))
		return
	}
	note := access.NoteFrom(r.Context())
	note.Set("template", req.Template)
	if req.Snapshot != "" {
		note.Set("snapshot", req.Snapshot)
	}
	rec, created, err := h.mgr.Create(r.Context(), createSpec(req), key)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	note.Session(rec.ID)
	note.Set("template", rec.Template)
	note.Set("replayed", !created)
	w.Header().Set("Location", "/v1/sessions/"+rec.ID)
	if !created {
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, sessionView(rec))
		return
	}
	writeJSON(w, http.StatusCreated, sessionView(rec))
}

// handleList: GET /v1/sessions[?state=running,paused,terminated|all][&limit=N][&metadata.KEY=VALUE...].
// Without state, sessions that have not ended are listed. Warm-pool
// members are never listed.
func (h *sessionAPI) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := node.SessionFilter{Metadata: map[string]string{}}
	switch st := q.Get("state"); st {
	case "":
		f.States = []node.State{node.StateCreating, node.StateRunning, node.StatePaused, node.StateTerminating}
	case "all":
		f.States = []node.State{node.StateCreating, node.StateRunning, node.StatePaused, node.StateTerminating, node.StateTerminated}
	default:
		for _, v := range strings.Split(st, ",") {
			switch state := node.State(v); state {
			case node.StateCreating, node.StateRunning, node.StatePaused, node.StateTerminating, node.StateTerminated:
				f.States = append(f.States, state)
			default:
				h.writeError(w, r, errdefs.InvalidField("state", "unknown state %q", v))
				return
			}
		}
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 10000 {
			h.writeError(w, r, errdefs.InvalidField("limit", "must be an integer between 1 and 10000"))
			return
		}
		f.Limit = n
	}
	for k, vs := range q {
		if mk, ok := strings.CutPrefix(k, "metadata."); ok && len(vs) > 0 {
			f.Metadata[mk] = vs[0]
		}
	}
	recs, err := h.mgr.List(r.Context(), f)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := make([]v1.Session, 0, len(recs))
	for _, rec := range recs {
		out = append(out, sessionView(rec))
	}
	writeJSON(w, http.StatusOK, v1.SessionList{Sessions: out})
}

func (h *sessionAPI) handleGet(w http.ResponseWriter, r *http.Request) {
	rec, err := h.mgr.Get(r.Context(), r.PathValue("id"))
	if errors.Is(err, errdefs.ErrNotFound) && h.ended != nil {
		if e := h.ended(r.Context(), r.PathValue("id")); e != nil {
			err = e
		}
	}
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionView(rec))
}

// handleDelete: DELETE /v1/sessions/{id}: 204 once it is gone (also when
// it had ended already).
func (h *sessionAPI) handleDelete(w http.ResponseWriter, r *http.Request) {
	if err := h.mgr.Destroy(r.Context(), r.PathValue("id")); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleTimeout: POST /v1/sessions/{id}/timeout {"timeout_s": N}: the
// session now ends N seconds from now.
func (h *sessionAPI) handleTimeout(w http.ResponseWriter, r *http.Request) {
	var req v1.TimeoutRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	rec, err := h.mgr.SetTimeout(r.Context(), r.PathValue("id"), req.TimeoutS)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionView(rec))
}

func (h *sessionAPI) handleUsage(w http.ResponseWriter, r *http.Request) {
	u, err := h.mgr.Usage(r.Context(), r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v1.Usage(*u))
}

// handleEgress: GET /v1/sessions/{id}/egress[?skip=N][&limit=N] → the
// session's egress records, oldest first (limit 1-1000, default 100).
func (h *sessionAPI) handleEgress(w http.ResponseWriter, r *http.Request) {
	skip, limit := 0, 100
	for name, dst := range map[string]*int{"skip": &skip, "limit": &limit} {
		if v := r.URL.Query().Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				h.writeError(w, r, errdefs.InvalidField(name, "must be an integer"))
				return
			}
			*dst = n
		}
	}
	recs, err := h.mgr.Egress(r.Context(), r.PathValue("id"), skip, limit)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.EgressList{Records: make([]v1.EgressRecord, 0, len(recs))}
	for _, e := range recs {
		out.Records = append(out.Records, v1.EgressRecord{Time: e.Time, Kind: e.Kind, Host: e.Host, Addr: e.Addr,
			Port: e.Port, BytesUp: e.BytesUp, BytesDown: e.BytesDown, Decision: e.Decision, Reason: e.Reason})
	}
	writeJSON(w, http.StatusOK, out)
}

// handlePause: POST /v1/sessions/{id}/pause → 200 with the session (paused).
func (h *sessionAPI) handlePause(w http.ResponseWriter, r *http.Request) {
	rec, err := h.mgr.Pause(r.Context(), r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionView(rec))
}

// handleResume: POST /v1/sessions/{id}/resume → 200 with the session (running).
func (h *sessionAPI) handleResume(w http.ResponseWriter, r *http.Request) {
	rec, err := h.mgr.Resume(r.Context(), r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionView(rec))
}

// checkHost checks the pinned host of a create or fork
// (v1.CreateRequest.Host): it needs an admin caller, and by the time the
// call reaches this host's API (the fleet's router forwarded it here, or
// there is none) it must name this host, self. "" is fine.
func checkHost(ctx context.Context, host, self string) error {
	if host == "" {
		return nil
	}
	if c, _ := tenancy.From(ctx); !c.Admin {
		return errdefs.Newf(errdefs.ErrPermissionDenied, "choosing the host of a session (field host) needs an admin key")
	}
	if host != self {
		return errdefs.InvalidField("host", "%q: this call runs on host %q only", host, self)
	}
	return nil
}
