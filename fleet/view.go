package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
)

// HostView is a registry kept in memory: one watch on the hosts bucket,
// opened once, applies every host's heartbeat as it is written, so a
// reader (a placement) gets every host's record without a round trip to
// JetStream. List opens a watch per call, which at the design's rate of
// creates is what breaks first (docs/SCALING.md); a view costs one
// message per heartbeat instead. Safe for concurrent use; Close it when
// done.
type HostView struct {
	r     *Registry
	w     jetstream.KeyWatcher
	ready chan struct{}
	done  chan struct{}

	mu    sync.RWMutex
	hosts map[string]Host // Heartbeat set from the entry's time
}

// View opens a HostView of r's bucket and waits (up to ctx) until it
// holds every record written so far. The error is ErrUnavailable when
// the bucket cannot be watched (no quorum) or ctx ends first.
func (r *Registry) View(ctx context.Context) (*HostView, error) {
	// The watch lives on after ctx: it ends with Close.
	w, err := r.kv.WatchAll(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("%w: fleet: watch hosts: %v", errdefs.ErrUnavailable, err)
	}
	v := &HostView{r: r, w: w, ready: make(chan struct{}), done: make(chan struct{}), hosts: map[string]Host{}}
	go v.apply()
	select {
	case <-v.ready:
		return v, nil
	case <-v.done:
		return nil, fmt.Errorf("%w: fleet: watch hosts: the watch ended", errdefs.ErrUnavailable)
	case <-ctx.Done():
		v.Close()
		return nil, fmt.Errorf("%w: fleet: watch hosts: %v", errdefs.ErrUnavailable, ctx.Err())
	}
}

// apply applies the watch's updates until it ends: a put replaces the
// host's record, a delete or purge removes it; the first nil (caught up)
// makes the view ready.
func (v *HostView) apply() {
	defer close(v.done)
	caught := false
	for e := range v.w.Updates() {
		if e == nil {
			if !caught {
				caught = true
				close(v.ready)
			}
			continue
		}
		v.mu.Lock()
		if e.Operation() != jetstream.KeyValuePut {
			delete(v.hosts, e.Key())
			v.mu.Unlock()
			continue
		}
		var h Host
		if err := json.Unmarshal(e.Value(), &h); err != nil {
			v.mu.Unlock()
			v.r.log.Warn("fleet: unreadable host record skipped", "host", e.Key(), "err", err)
			continue
		}
		h.ID, h.Heartbeat = e.Key(), e.Created()
		v.hosts[e.Key()] = h
		v.mu.Unlock()
	}
}

// Hosts returns every host's record as of the latest update the view
// applied, sorted by id, with State, Heartbeat and Placeable as List sets
// them (a heartbeat older than the registry's LostAfter is HostLost, by
// the time of the call).
func (v *HostView) Hosts() []Host {
	now := time.Now()
	v.mu.RLock()
	out := make([]Host, 0, len(v.hosts))
	for _, h := range v.hosts {
		if now.Sub(h.Heartbeat) > v.r.opts.LostAfter {
			h.State = HostLost
		}
		h.Placeable = h.State == HostReady && Compatible(v.r.opts.Version, h.Version)
		out = append(out, h)
	}
	v.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Ended reports whether the view's watch has ended (its connection's
// subscription gone): its records no longer change, and a reader should
// open a new view.
func (v *HostView) Ended() bool {
	select {
	case <-v.done:
		return true
	default:
		return false
	}
}

// Close stops the view's watch and waits until it no longer applies
// updates. Safe to call more than once.
func (v *HostView) Close() {
	_ = v.w.Stop()
	<-v.done
}
