// Package metrics exposes forkbox's Prometheus metrics (client_golang):
// sessions by state, create and exec latency, warm-pool depth, snapshot
// bytes, egress denials, abuse kills, admission refusals and the host
// monitor's round time and overruns. Gauges that
// describe the present (sessions, pools, snapshot bytes) are read from a
// Source when scraped; events are counted as they happen. Every method of
// a nil *Set does nothing, so packages can be used without metrics.
package metrics

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Source reports the present state at scrape time.
type Source interface {
	// SessionStates counts the sessions that exist now, by state
	// (creating, running, paused, terminating, pooled).
	SessionStates() map[string]int
	// PoolDepths counts ready warm-pool members by template (and the
	// ready spares under pool.SpareLabel).
	PoolDepths() map[string]int
	// SnapshotBytes is what stored snapshots hold, in bytes: files (over
	// their parents) and memory checkpoints.
	SnapshotBytes() (files, memory int64)
	// DigestedEntries counts the entries snapshot digests and integrity
	// checks have walked since the daemon started (a counter).
	DigestedEntries() int64
}

// Set holds forkbox's metrics in their own registry.
type Set struct {
	reg          *prometheus.Registry
	create       *prometheus.HistogramVec
	exec         prometheus.Histogram
	egressDenied *prometheus.CounterVec
	abuseKills   *prometheus.CounterVec
	refused      *prometheus.CounterVec
	ended        *prometheus.CounterVec
	round        prometheus.Histogram
	overruns     prometheus.Counter
	present      *present
}

// latencyBuckets spans 1 ms to about 16 s, in seconds.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// New returns the metrics, with the Go runtime and process collectors
// beside them; the present state is read from the Source given to
// SetSource (until then those gauges are absent).
func New() *Set {
	s := &Set{
		reg: prometheus.NewRegistry(),
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "forkbox_session_create_seconds", Help: "Time to create a session, by path (pool, spare, cold, snapshot).",
			Buckets: latencyBuckets}, []string{"path"}),
		exec: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "forkbox_exec_seconds", Help: "Time from an exec request to its command's end.", Buckets: latencyBuckets}),
		egressDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkbox_egress_denied_total", Help: "Egress connections and DNS queries refused, by tenant."},
			[]string{"tenant"}),
		abuseKills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkbox_abuse_kills_total", Help: "Sessions killed by the abuse detector, by pattern."},
			[]string{"pattern"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkbox_admission_refused_total", Help: "Creates refused by admission control, by problem type."},
			[]string{"type"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkbox_sessions_ended_total", Help: "Sessions that ended, by reason."}, []string{"reason"}),
		round: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "forkbox_monitor_round_seconds", Help: "Time one round of the host monitor took (every running session sampled).",
			Buckets: latencyBuckets}),
		overruns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "forkbox_monitor_overruns_total", Help: "Host monitor rounds that took longer than their interval."}),
		present: &present{},
	}
	s.reg.MustRegister(s.create, s.exec, s.egressDenied, s.abuseKills, s.refused, s.ended, s.round, s.overruns,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		s.present)
	return s
}

// SetSource names where scrapes read the present state from.
func (s *Set) SetSource(src Source) {
	s.present.mu.Lock()
	s.present.src = src
	s.present.mu.Unlock()
}

// Handler serves the metrics in the Prometheus exposition format.
func (s *Set) Handler() http.Handler {
	return promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
}

// ObserveCreate records one successful create of path (pool, cold,
// snapshot) that took d.
func (s *Set) ObserveCreate(path string, d time.Duration) {
	if s != nil {
		s.create.WithLabelValues(path).Observe(d.Seconds())
	}
}

// ObserveExec records one foreground exec that took d.
func (s *Set) ObserveExec(d time.Duration) {
	if s != nil {
		s.exec.Observe(d.Seconds())
	}
}

// EgressDenied counts n egress refusals of tenant's sessions.
func (s *Set) EgressDenied(tenant string, n int) {
	if s != nil && n > 0 {
		s.egressDenied.WithLabelValues(tenant).Add(float64(n))
	}
}

// AbuseKill counts a session killed for pattern (mining, scanning,
// fork-bomb).
func (s *Set) AbuseKill(pattern string) {
	if s != nil {
		s.abuseKills.WithLabelValues(pattern).Inc()
	}
}

// Refused counts a create refused with problem type typ.
func (s *Set) Refused(typ string) {
	if s != nil {
		s.refused.WithLabelValues(typ).Inc()
	}
}

// Ended counts a session that ended for reason.
func (s *Set) Ended(reason string) {
	if s != nil {
		s.ended.WithLabelValues(reason).Inc()
	}
}

// ObserveMonitorRound records one round of the host monitor that took d;
// overran says it took longer than its interval (or was cut short there).
func (s *Set) ObserveMonitorRound(d time.Duration, overran bool) {
	if s != nil {
		s.round.Observe(d.Seconds())
		if overran {
			s.overruns.Inc()
		}
	}
}

// present collects the gauges that describe now, from the Source.
type present struct {
	mu  sync.Mutex
	src Source
}

var (
	sessionsDesc = prometheus.NewDesc("forkbox_sessions", "Sessions that exist now, by state.", []string{"state"}, nil)
	poolDesc     = prometheus.NewDesc("forkbox_pool_ready", "Ready warm-pool members, by template; spare sandboxes under template \"(spare)\".", []string{"template"}, nil)
	snapDesc     = prometheus.NewDesc("forkbox_snapshot_bytes", "Bytes held by stored snapshots, by kind (files, memory).",
		[]string{"kind"}, nil)
	digestDesc = prometheus.NewDesc("forkbox_snapshot_digest_entries_total",
		"Entries (files, directories, links) walked by snapshot digests and integrity checks; a check that reuses a verified digest walks none.",
		nil, nil)
)

func (p *present) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionsDesc
	ch <- poolDesc
	ch <- snapDesc
	ch <- digestDesc
}

func (p *present) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	src := p.src
	p.mu.Unlock()
	if src == nil {
		return
	}
	states := src.SessionStates()
	for _, st := range []string{"creating", "running", "paused", "terminating", "pooled"} {
		ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(states[st]), st)
	}
	for tpl, n := range src.PoolDepths() {
		ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(n), tpl)
	}
	files, memory := src.SnapshotBytes()
	ch <- prometheus.MustNewConstMetric(snapDesc, prometheus.GaugeValue, float64(files), "files")
	ch <- prometheus.MustNewConstMetric(snapDesc, prometheus.GaugeValue, float64(memory), "memory")
	ch <- prometheus.MustNewConstMetric(digestDesc, prometheus.CounterValue, float64(src.DigestedEntries()))
}
