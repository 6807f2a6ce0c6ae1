package e2b

import (
	"net/http"
	"strconv"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/node"
)

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

// handleMetrics: GET /sandboxes/{id}/metrics?start=&end= (Unix seconds,
// both optional) → 200 SandboxMetric[], oldest first: the samples the
// host's monitor took of the sandbox (one per 5 s round while it ran, its
// last hour) in [start, end], then one taken now when now is in range.
// Disk use is read now only: every sample carries the current diskUsed.
func (h *Handler) handleMetrics(w http.ResponseWriter, r *http.Request) {
	var bounds [2]time.Time
	for i, p := range []string{"start", "end"} {
		v := r.URL.Query().Get(p)
		if v == "" {
			continue
		}
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			h.fail(w, r, errdefs.InvalidField(p, "must be Unix seconds"))
			return
		}
		bounds[i] = time.Unix(sec, 0).UTC()
	}
	from, to := bounds[0], bounds[1]
	if !to.IsZero() {
		to = to.Add(time.Second - time.Nanosecond) // end is a whole second
	}
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	samples, err := h.mgr.UsageHistory(r.Context(), rec.ID, time.Time{}, time.Time{})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	u, err := h.mgr.Usage(r.Context(), rec.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	now := time.Now().UTC()
	samples = append(samples, node.UsageSample{Time: now, CPUSeconds: u.CPUSeconds, MemoryBytes: u.MemoryBytes})
	inRange := func(t time.Time) bool {
		return (from.IsZero() || !t.Before(from)) && (to.IsZero() || !t.After(to))
	}
	cpus := max(int(rec.CPU+0.999), 1)
	out := []sandboxMetric{}
	prev := node.UsageSample{Time: rec.StartedAt}
	for _, s := range samples {
		if inRange(s.Time) {
			out = append(out, sandboxMetric{
				Timestamp: s.Time, TimestampUnix: s.Time.Unix(), CPUCount: cpus, CPUUsedPct: cpuPercent(rec, prev, s),
				MemUsed: s.MemoryBytes, MemTotal: rec.MemoryMB << 20, DiskUsed: u.DiskBytes, DiskTotal: rec.DiskMB << 20,
			})
		}
		prev = s
	}
	httpjson.Write(w, http.StatusOK, out)
}

// cpuPercent is the CPU rec's sandbox used between samples a and b, as a
// percentage of its quota (rec.CPU cores), 0-100. A pause between them
// counts as time, so it lowers the share.
func cpuPercent(rec *node.Session, a, b node.UsageSample) float64 {
	elapsed := b.Time.Sub(a.Time).Seconds()
	if elapsed <= 0 || rec.CPU <= 0 {
		return 0
	}
	pct := (b.CPUSeconds - a.CPUSeconds) / elapsed / rec.CPU * 100
	return min(max(pct, 0), 100)
}
