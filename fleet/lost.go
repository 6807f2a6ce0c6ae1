package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
)

// LostWatcher turns hosts the registry reports lost into terminated
// sessions: each of its sweeps lists the hosts (one pass over the small
// host bucket) and, for hosts newly lost, marks their sessions' directory
// entries terminated with ReasonHostLost (as Directory.MarkHostLost
// does, in one directory pass for all of them). A host
// still lost is swept again every LostAfter, so an entry written just
// before the host went is caught too. Nothing is marked while this
// host's own heartbeats have not succeeded for a whole LostAfter (the
// registry's Run): an old record is evidence of a host gone only when
// the bucket took writes all that time (a leader election after a node
// went stalls every host's heartbeat alike). Every host may run one: the
// marks are compare-and-set writes, so two watchers marking the same
// host write each entry once. Safe for concurrent use.
type LostWatcher struct {
	reg  *Registry
	dir  *Directory
	self string
	log  *slog.Logger

	mu sync.Mutex
	// swept is when each lost host was last swept; a host that comes
	// back is dropped from it.
	swept map[string]time.Time
}

// NewLostWatcher returns the watcher of reg's hosts that marks dir's
// entries; self (this host's id) is never marked. log may be nil.
func NewLostWatcher(reg *Registry, dir *Directory, self string, log *slog.Logger) *LostWatcher {
	if log == nil {
		log = slog.Default()
	}
	return &LostWatcher{reg: reg, dir: dir, self: self, log: log, swept: map[string]time.Time{}}
}

// Sweep runs one pass now and returns, by host, the sessions it marked
// terminated. The hosts newly lost (or due a repeat sweep) are marked in
// one pass over the directory, however many they are. The error is
// ErrUnavailable when the registry or the directory cannot be read or
// written (no quorum); the marks made before it stay.
func (w *LostWatcher) Sweep(ctx context.Context) (map[string][]Location, error) {
	if !w.reg.writable() {
		// This host's own heartbeats failed within LostAfter (a leader
		// election after a node went, a cut): the others' records may
		// be old for the same reason. No host is taken for lost until
		// the bucket has taken writes for a whole LostAfter.
		return map[string][]Location{}, nil
	}
	hosts, err := w.reg.List(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	lost, due := map[string]bool{}, map[string]bool{}
	for _, h := range hosts {
		if h.ID == w.self || h.State != HostLost {
			continue
		}
		lost[h.ID] = true
		if last, ok := w.swept[h.ID]; !ok || now.Sub(last) >= w.reg.LostAfter() {
			due[h.ID] = true
		}
	}
	for id := range w.swept {
		if !lost[id] {
			delete(w.swept, id)
		}
	}
	if len(due) == 0 {
		return map[string][]Location{}, nil
	}
	marked, err := markLost(ctx, w.dir, due)
	for id, ls := range marked {
		w.log.Warn("fleet: host lost; its sessions are terminated", "host", id, "sessions", len(ls))
	}
	if err != nil {
		return marked, err
	}
	for id := range due {
		w.swept[id] = now
	}
	return marked, nil
}

// Live returns the ids of the hosts in the registry not taken for gone:
// every host but those List reports HostLost. By the LostWatcher's rule
// (Sweep), a lost state is evidence of a host gone only once this host's
// own heartbeats have succeeded for a whole LostAfter; until then (a
// leader election or a cut stalled every host's heartbeat alike) Live
// is ErrUnavailable, as it is when the registry cannot be read, so that
// no caller drops what a live host holds (its quota counts) meanwhile.
func (r *Registry) Live(ctx context.Context) (map[string]bool, error) {
	if !r.writable() {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "fleet: this host's heartbeats have not been written for a whole %v yet", r.opts.LostAfter)
	}
	hosts, err := r.List(ctx)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, h := range hosts {
		if h.State != HostLost {
			live[h.ID] = true
		}
	}
	return live, nil
}

// markLost marks every live session entry of the hosts in lost
// terminated with ReasonHostLost, in one pass over the directory, each by
// compare-and-set (an entry rewritten meanwhile is left alone), and
// returns the entries it marked by host.
func markLost(ctx context.Context, dir *Directory, lost map[string]bool) (map[string][]Location, error) {
	ls, err := dir.List(ctx, KindSession, func(l Location) bool { return lost[l.Host] && l.State == "" })
	if err != nil {
		return nil, err
	}
	marked := map[string][]Location{}
	for _, l := range ls {
		l.State, l.Reason = LocationTerminated, ReasonHostLost
		if err := dir.Update(ctx, l); err != nil {
			if errors.Is(err, errdefs.ErrConflict) {
				continue
			}
			return marked, err
		}
		marked[l.Host] = append(marked[l.Host], l)
	}
	return marked, nil
}

// Run sweeps every interval (0: the registry's heartbeat interval) until
// ctx ends, the first sweep a LostAfter after Run starts: hosts that
// start together (a whole fleet coming back) give each other that long
// to write their records before any is taken for lost. A failed sweep is
// logged once per run of failures and tried again at the next tick.
func (w *LostWatcher) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = w.reg.opts.Heartbeat
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(w.reg.LostAfter()):
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := w.Sweep(sctx)
		cancel()
		if err != nil && !failing && ctx.Err() == nil {
			w.log.Warn("fleet: host-lost sweep failed; retrying", "err", err)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Reconcile is what a host does when it comes back: first it waits (at
// most currentWait) until every online replica of the directory has caught
// up with its leader, since the listing may be served from any of them
// and a host just restarted holds a copy from before it went; then every
// session entry of the directory that names host self and that the fleet
// gave up on
// (State LocationTerminated) has its local sandbox destroyed with destroy
// and then its entry removed. destroy gets the session id; an
// ErrNotFound from it (the host does not have that session) counts as
// destroyed. Live entries are left alone. It returns the ids whose entry
// it removed; the error is the first destroy or directory failure (the
// entries not yet handled stay, for the next Reconcile).
func Reconcile(ctx context.Context, dir *Directory, self string, destroy func(ctx context.Context, id string) error) ([]string, error) {
	if err := dir.awaitReplicas(ctx, currentWait); err != nil {
		return nil, err
	}
	ls, err := dir.List(ctx, KindSession, func(l Location) bool { return l.Host == self && l.State == LocationTerminated })
	if err != nil {
		return nil, err
	}
	var done []string
	for _, l := range ls {
		if err := destroy(ctx, l.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return done, fmt.Errorf("fleet: reconcile: destroy session %s the fleet gave up on: %w", l.ID, err)
		}
		if err := dir.Delete(ctx, KindSession, l.ID); err != nil {
			return done, err
		}
		done = append(done, l.ID)
	}
	return done, nil
}

// Ended returns the error a caller gets for session id when this host
// does not hold it and the directory has given up on it: ErrTerminated
// naming the entry's Reason ("session ID ended (host-lost)"); nil when the
// directory has no entry for id or a live one (the caller answers as it
// would without the directory), or when visible rejects the entry's
// tenant (a caller learns nothing of another tenant's sessions). A
// directory that cannot be read is nil as well: the caller's own answer
// (not found) stands rather than a 503 for a session that may never have
// existed.
func (d *Directory) Ended(ctx context.Context, id string, visible func(tenant string) bool) error {
	l, err := d.Get(ctx, KindSession, id)
	if err != nil || l.State != LocationTerminated {
		return nil
	}
	if visible != nil && !visible(l.Tenant) {
		return nil
	}
	reason := l.Reason
	if reason == "" {
		reason = "terminated"
	}
	return errdefs.Newf(errdefs.ErrTerminated, "session %s ended (%s): the fleet gave up on its host %s", id, reason, l.Host)
}

// currentWait bounds how long Reconcile waits for the directory's
// replicas to catch up; past it, it lists what it can (its later pass
// catches up).
const currentWait = 30 * time.Second

// awaitReplicas waits until every replica of the directory's stream that
// is not gone is current with its leader (no lag), polling the stream's
// info (answered by the leader) every 100 ms, for at most max; a stream
// without replicas (a host alone) is current at once. A replica is gone
// when NATS reports it offline or its leader has not heard from it for
// replicaSilent, except this host's own (d.node), which is waited for
// however long it was away: its copy is the one this host reads. The
// error is ctx's.
func (d *Directory) awaitReplicas(ctx context.Context, max time.Duration) error {
	deadline := time.Now().Add(max)
	for {
		st, err := d.kv.Status(ctx)
		if err == nil {
			kst, ok := st.(*jetstream.KeyValueBucketStatus)
			if !ok || replicasCurrent(kst.StreamInfo(), d.node) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: fleet: wait for the directory's replicas: %v", errdefs.ErrUnavailable, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// replicaSilent is how long a stream's leader may not have heard from a
// replica before awaitReplicas takes it for gone: NATS marks a killed
// server offline only when its statistics time out, tens of seconds
// later, while its raft heartbeats (every second) stop at once.
const replicaSilent = 5 * time.Second

// replicasCurrent reports whether si's stream has a leader and every
// replica that is not gone (offline, or silent for replicaSilent unless
// it is node's) is current with it.
func replicasCurrent(si *jetstream.StreamInfo, node string) bool {
	if si == nil || si.Cluster == nil {
		return true
	}
	if si.Cluster.Leader == "" {
		return false
	}
	for _, r := range si.Cluster.Replicas {
		if r == nil || r.Offline || (r.Name != node && r.Active > replicaSilent) {
			continue
		}
		if !r.Current || r.Lag > 0 {
			return false
		}
	}
	return true
}
