package monitor

import (
	"sync"
	"time"

	"github.com/forkbox/forkbox/node"
)

// historySamples bounds the samples kept per session: at the monitor's
// 5 s interval, its last hour.
const historySamples = 720

// history keeps each live session's recent usage samples (the monitor's
// readings), for E2B's getMetrics(start, end). Safe for concurrent use.
type history struct {
	mu    sync.Mutex
	rings map[string]*ring
}

// ring is one session's samples, oldest first from start.
type ring struct {
	buf   []node.UsageSample
	start int
}

func newHistory() *history { return &history{rings: map[string]*ring{}} }

// add appends s to session id's samples, dropping the oldest past
// historySamples.
func (h *history) add(id string, s node.UsageSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[id]
	if r == nil {
		r = &ring{}
		h.rings[id] = r
	}
	if len(r.buf) < historySamples {
		r.buf = append(r.buf, s)
		return
	}
	r.buf[r.start] = s
	r.start = (r.start + 1) % historySamples
}

// between returns session id's samples taken in [from, to] (a zero bound
// is open), oldest first.
func (h *history) between(id string, from, to time.Time) []node.UsageSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[id]
	out := []node.UsageSample{}
	if r == nil {
		return out
	}
	for i := range r.buf {
		s := r.buf[(r.start+i)%len(r.buf)]
		if (!from.IsZero() && s.Time.Before(from)) || (!to.IsZero() && s.Time.After(to)) {
			continue
		}
		out = append(out, s)
	}
	return out
}

// UsageHistory returns the samples the monitor took of session id in
// [from, to] (zero: open), oldest first: at most its last hour, one per
// round while it ran (none while paused).
func (mon *Monitor) UsageHistory(id string, from, to time.Time) []node.UsageSample {
	return mon.history.between(id, from, to)
}

// ForgetHistory drops session id's samples (it ended).
func (mon *Monitor) ForgetHistory(id string) {
	mon.history.mu.Lock()
	delete(mon.history.rings, id)
	mon.history.mu.Unlock()
}
