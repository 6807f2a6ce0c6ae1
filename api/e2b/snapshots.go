package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/node"
)

// forkSnapshotTTL is how long the snapshot behind an E2B fork is kept
// at least; after that it is collected as soon as no fork uses it (E2B
// forks leave no snapshot behind).
const forkSnapshotTTL = 10 * time.Minute

// snapshotInfo is components.schemas.SnapshotInfo.
type snapshotInfo struct {
	// SnapshotID restores the snapshot as a create's templateID.
	SnapshotID string `json:"snapshotID"`
	// Names are the names it was given (at most one in forkbox).
	Names []string `json:"names"`
}

func snapshotInfoOf(sn *node.Snapshot) snapshotInfo {
	names := []string{}
	if sn.Name != "" {
		names = append(names, sn.Name)
	}
	return snapshotInfo{SnapshotID: sn.ID, Names: names}
}

// handleSnapshot: POST /sandboxes/{id}/snapshots {"name"?} → 201
// SnapshotInfo. The sandbox keeps running. In the runc tier a snapshot
// holds the sandbox's files, not its processes or memory.
func (h *Handler) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decode(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	sn, err := h.mgr.Snapshot(r.Context(), rec.ID, node.SnapshotOptions{Name: body.Name})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusCreated, snapshotInfoOf(sn))
}

// handleSnapshots: GET /snapshots?sandboxID=&name=&limit=&nextToken= →
// 200 SnapshotInfo[], newest first, with X-Next-Token when there is more.
func (h *Handler) handleSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := maxListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			h.fail(w, r, errdefs.InvalidField("limit", "must be between 1 and %d", maxListLimit))
			return
		}
		limit = n
	}
	var after *node.ListCursor
	if v := q.Get("nextToken"); v != "" {
		c, err := decodeCursor(v)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		after = &c
	}
	all, err := h.mgr.ListSnapshots(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sandboxID, name := q.Get("sandboxID"), q.Get("name")
	var page []*node.Snapshot
	for _, sn := range all { // newest first, ties by id: the cursor's order
		if (sandboxID != "" && sn.SessionID != sandboxID) || (name != "" && sn.Name != name) {
			continue
		}
		if !sn.ExpiresAt.IsZero() {
			continue // temporary (a fork's): E2B forks leave no snapshot to list
		}
		if after != nil && !(sn.CreatedAt.Before(after.CreatedAt) ||
			(sn.CreatedAt.Equal(after.CreatedAt) && sn.ID > after.ID)) {
			continue
		}
		page = append(page, sn)
	}
	page = cutPage(w, page, limit, func(sn *node.Snapshot) node.ListCursor {
		return node.ListCursor{CreatedAt: sn.CreatedAt, ID: sn.ID}
	})
	out := make([]snapshotInfo, 0, len(page))
	for _, sn := range page {
		out = append(out, snapshotInfoOf(sn))
	}
	httpjson.Write(w, http.StatusOK, out)
}

// handleDeleteSnapshot: DELETE /templates/{id} → 204, E2B's way to delete
// a snapshot (Sandbox.deleteSnapshot). 404 when no snapshot has that id.
// Sandboxes restored from it keep running with their own files, as at
// E2B, on btrfs storage; on overlay storage (where the snapshot is a layer
// under them) and while sandboxes run from its memory checkpoint it is
// 409 until they end (Node.DeleteSnapshotKeepDependents). Templates
// themselves are managed through forkbox's API (DELETE
// /v1/templates/{name}).
func (h *Handler) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sn, err := h.mgr.GetSnapshot(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot %q not found", id))
		return
	}
	if err == nil {
		err = h.mgr.DeleteSnapshotKeepDependents(r.Context(), sn.ID)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkResult is one element of the fork response: a sandbox or an error.
type forkResult struct {
	Sandbox *sandboxView `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// handleFork: POST /sandboxes/{id}/fork {"count"?: 1..64, "timeout"?: s}
// → 201 [{"sandbox": Sandbox}, ...]. The forks start from a snapshot of
// the sandbox's files taken now (processes and memory are not carried
// over in the runc tier); the source keeps running. All or nothing: when
// one fork fails, none is kept and the error is the answer.
func (h *Handler) handleFork(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	var req node.CreateSpec
	if body.Timeout != nil {
		if *body.Timeout < 1 {
			h.fail(w, r, errdefs.InvalidField("timeout", "must be at least 1 second"))
			return
		}
		req.TimeoutS = *body.Timeout
	}
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	_, sessions, err := h.mgr.ForkSession(r.Context(), rec.ID, count, req,
		node.SnapshotOptions{ExpiresIn: forkSnapshotTTL})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := make([]forkResult, 0, len(sessions))
	for _, s := range sessions {
		v := h.view(s)
		out = append(out, forkResult{Sandbox: &v})
	}
	httpjson.Write(w, http.StatusCreated, out)
}
