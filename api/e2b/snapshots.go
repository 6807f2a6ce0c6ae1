package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
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
// a snapshot (Sandbox.deleteSnapshot). 404 when no snapshot has that id;
// 409 while sandboxes restored from it still run. Templates themselves are
// managed through forkbox's API (DELETE /v1/templates/{name}).
func (h *Handler) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sn, err := h.mgr.GetSnapshot(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot %q not found", id))
		return
	}
	if err == nil {
		err = h.mgr.DeleteSnapshot(r.Context(), sn.ID, false)
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

// sandboxMetric is components.schemas.SandboxMetric. Memory and disk are
// in bytes; cpuUsedPct is the share of the sandbox's CPUs used since the
// previous sample (0-100).
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// handleMetrics: GET /sandboxes/{id}/metrics?start=&end= (Unix seconds) →
// 200 SandboxMetric[]. forkbox keeps no history: the answer is one sample
// taken now, or none when now is outside [start, end].
func (h *Handler) handleMetrics(w http.ResponseWriter, r *http.Request) {
	now := time.Now().UTC()
	for _, p := range []string{"start", "end"} {
		v := r.URL.Query().Get(p)
		if v == "" {
			continue
		}
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			h.fail(w, r, errdefs.InvalidField(p, "must be Unix seconds"))
			return
		}
		if (p == "start" && now.Unix() < sec) || (p == "end" && now.Unix() > sec) {
			httpjson.Write(w, http.StatusOK, []sandboxMetric{})
			return
		}
	}
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	u, err := h.mgr.Usage(r.Context(), rec.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	cpus := max(int(rec.CPU+0.999), 1)
	m := sandboxMetric{
		Timestamp: now, TimestampUnix: now.Unix(), CPUCount: cpus,
		CPUUsedPct: h.metrics.percent(rec, u.CPUSeconds, now),
		MemUsed:    u.MemoryBytes, MemTotal: rec.MemoryMB << 20,
		DiskUsed: u.DiskBytes, DiskTotal: rec.DiskMB << 20,
	}
	httpjson.Write(w, http.StatusOK, []sandboxMetric{m})
}

// cpuSampler remembers each sandbox's last CPU reading, to turn the
// cumulative CPU time into a usage percentage between two readings.
type cpuSampler struct {
	mu   sync.Mutex
	last map[string]cpuSample
}

type cpuSample struct {
	at         time.Time
	cpuSeconds float64
}

// samplerTTL drops readings not renewed for this long.
const samplerTTL = 10 * time.Minute

func newCPUSampler() *cpuSampler { return &cpuSampler{last: map[string]cpuSample{}} }

// percent returns the CPU use of rec's sandbox since its previous reading
// (since it started, for the first), as a percentage of its CPU quota
// (rec.CPU cores), and records this reading.
func (c *cpuSampler) percent(rec *node.Session, cpuSeconds float64, now time.Time) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, s := range c.last {
		if now.Sub(s.at) > samplerTTL {
			delete(c.last, id)
		}
	}
	prev, ok := c.last[rec.ID]
	if !ok {
		prev = cpuSample{at: rec.StartedAt}
	}
	c.last[rec.ID] = cpuSample{at: now, cpuSeconds: cpuSeconds}
	elapsed := now.Sub(prev.at).Seconds()
	if elapsed <= 0 || rec.CPU <= 0 {
		return 0
	}
	pct := (cpuSeconds - prev.cpuSeconds) / elapsed / rec.CPU * 100
	return min(max(pct, 0), 100)
}
