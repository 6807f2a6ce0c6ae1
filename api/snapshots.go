package api

import (
	"math"
	"net/http"
	"time"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// maxSnapshotExpiryS is the largest expires_in_s a time.Duration holds
// (about 292 years).
const maxSnapshotExpiryS = math.MaxInt64 / int64(time.Second)

// handleSnapshot: POST /v1/sessions/{id}/snapshot [{"expires_in_s": N} or
// {"expires_at": RFC 3339}] →
// 201 with the snapshot. The session keeps running.
func (h *snapshotAPI) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	var req v1.SnapshotRequest
	if err := decodeJSON(r, &req, maxJSONBody, true); err != nil {
		h.writeError(w, r, err)
		return
	}
	if req.ExpiresInS > maxSnapshotExpiryS {
		// In nanoseconds it would wrap around, to a past or near expiry.
		h.writeError(w, r, errdefs.InvalidField("expires_in_s", "must be at most %d", maxSnapshotExpiryS))
		return
	}
	expiresIn := time.Duration(req.ExpiresInS) * time.Second
	if req.ExpiresAt != nil {
		if req.ExpiresInS != 0 {
			h.writeError(w, r, errdefs.InvalidField("expires_at", "give expires_at or expires_in_s, not both"))
			return
		}
		if expiresIn = time.Until(*req.ExpiresAt); expiresIn <= 0 {
			h.writeError(w, r, errdefs.InvalidField("expires_at", "is in the past"))
			return
		}
	}
	sn, err := h.mgr.Snapshot(r.Context(), r.PathValue("id"), node.SnapshotOptions{ExpiresIn: expiresIn, Name: req.Name, Memory: req.Memory})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	noteSnapshot(r, sn)
	w.Header().Set("Location", "/v1/snapshots/"+sn.ID)
	writeJSON(w, http.StatusCreated, snapshotView(sn))
}

// handleSessionFork: POST /v1/sessions/{id}/fork {"count": N, ...overrides}:
// snapshot the session, then start N sessions from the snapshot. 201.
func (h *snapshotAPI) handleSessionFork(w http.ResponseWriter, r *http.Request) {
	var req v1.ForkRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := checkHost(r.Context(), req.Host, h.self.get()); err != nil {
		h.writeError(w, r, err)
		return
	}
	sn, sessions, err := h.mgr.ForkSession(r.Context(), r.PathValue("id"), req.Count, createSpec(req.CreateRequest), node.SnapshotOptions{Memory: req.Memory})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	noteSnapshot(r, sn)
	noteForks(r, sessions)
	writeJSON(w, http.StatusCreated, forkView(sn, sessions))
}

// handleSnapshotFork: POST /v1/snapshots/{id}/fork {"count": N, ...overrides}
// starts N sessions from the snapshot. 201. With "run" it runs a command
// in each and streams their results (handleForkRun).
func (h *snapshotAPI) handleSnapshotFork(w http.ResponseWriter, r *http.Request) {
	var req v1.ForkRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := checkHost(r.Context(), req.Host, h.self.get()); err != nil {
		h.writeError(w, r, err)
		return
	}
	if req.Run != nil {
		h.handleForkRun(w, r, req)
		return
	}
	if req.Keep != "" || req.Score != nil {
		h.writeError(w, r, errdefs.InvalidField("keep", "keep and score need run"))
		return
	}
	id := r.PathValue("id")
	sessions, err := h.mgr.Fork(r.Context(), id, req.Count, createSpec(req.CreateRequest))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	noteForks(r, sessions)
	sn, err := h.mgr.GetSnapshot(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, forkView(sn, sessions))
}

// noteSnapshot adds snapshot sn to the request's audit record.
func noteSnapshot(r *http.Request, sn *node.Snapshot) {
	note := access.NoteFrom(r.Context())
	note.Set("snapshot", sn.ID)
	note.Set("bytes", sn.SizeBytes)
	if sn.MemoryDriver != "" {
		note.Set("memory_bytes", sn.MemoryBytes)
	}
}

// noteForks adds the sessions a fork started to the request's audit record.
func noteForks(r *http.Request, sessions []*node.Session) {
	ids := make([]string, len(sessions))
	for i, rec := range sessions {
		ids[i] = rec.ID
	}
	noteIDs(r, ids)
}

// noteIDs adds the ids of the sessions a fork started to the request's
// audit record.
func noteIDs(r *http.Request, ids []string) {
	access.NoteFrom(r.Context()).Set("sessions", ids)
}

func forkView(sn *node.Snapshot, sessions []*node.Session) v1.ForkResult {
	out := v1.ForkResult{Snapshot: snapshotView(sn), Sessions: make([]v1.Session, 0, len(sessions))}
	for _, rec := range sessions {
		out.Sessions = append(out.Sessions, sessionView(rec))
	}
	return out
}

func (h *snapshotAPI) handleSnapshots(w http.ResponseWriter, r *http.Request) {
	snaps, err := h.mgr.ListSnapshots(r.Context())
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.SnapshotList{Snapshots: make([]v1.Snapshot, 0, len(snaps))}
	for _, sn := range snaps {
		out.Snapshots = append(out.Snapshots, snapshotView(sn))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *snapshotAPI) handleGetSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := h.mgr.GetSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotView(sn))
}

// handleDeleteSnapshot: DELETE /v1/snapshots/{id}[?force=true]: 204; 409
// while sessions or child snapshots use it (force destroys and deletes
// them first).
func (h *snapshotAPI) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request) {
	force, err := boolParam(r, "force")
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := h.mgr.DeleteSnapshot(r.Context(), r.PathValue("id"), force); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *snapshotAPI) handlePools(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, v1.PoolList{Pools: pools(h.mgr.PoolList())})
}

// handleSetPool: PUT /v1/pools/{template} {"size": N, "cpu"?, "memory_mb"?,
// "pids"?, "disk_mb"?} → 200 with the pool.
func (h *snapshotAPI) handleSetPool(w http.ResponseWriter, r *http.Request) {
	var req v1.Pool
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	if req.Template != "" && req.Template != r.PathValue("template") {
		h.writeError(w, r, errdefs.InvalidField("template", "differs from the path"))
		return
	}
	req.Template = r.PathValue("template")
	p, err := h.mgr.SetPool(r.Context(), node.Pool{Template: req.Template, Size: req.Size, CPU: req.CPU,
		MemoryMB: req.MemoryMB, Pids: req.Pids, DiskMB: req.DiskMB})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, poolView(p))
}
