package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
)

// HostsBucket is the JetStream KV bucket of the host registry: one key
// per host id, its value the host's latest Host record (JSON).
const HostsBucket = "forkbox-hosts"

// DefaultHeartbeat is how often a host rewrites its record.
const DefaultHeartbeat = 2 * time.Second

// DefaultLostAfter is how long a host's record may go unrewritten before
// the registry reports the host lost (forkbox serve --host-lost-after).
const DefaultLostAfter = 15 * time.Second

// HostState is a host's state in the fleet.
type HostState string

const (
	// HostReady takes placements.
	HostReady HostState = "ready"
	// HostDraining takes no new placements; its sessions run on.
	HostDraining HostState = "draining"
	// HostLost has not sent a heartbeat for longer than the registry's
	// LostAfter. No host writes it: readers derive it (List).
	HostLost HostState = "lost"
)

// Host is one host's record in the registry.
type Host struct {
	// ID is the host's fleet id (--node-id; "local" alone).
	ID string `json:"id"`
	// API is the base URL of the host's forkbox API.
	API string `json:"api"`
	// Version is the forkbox version the host runs (version.String()).
	Version string `json:"version"`
	// Tiers are the isolation drivers the host has ("runc", "gvisor").
	Tiers []string `json:"tiers"`
	// Capacity is what the host can run.
	Capacity Capacity `json:"capacity"`
	// Load is what it runs now.
	Load Load `json:"load"`
	// State is the host's own state (ready or draining); List reports
	// HostLost for a host whose heartbeat is missing.
	State HostState `json:"state"`
	// Started is when the host's daemon started.
	Started time.Time `json:"started"`
	// Templates are the names of the templates the host has (nil: not
	// said; placement then takes the host to have every one).
	Templates []string `json:"templates,omitempty"`
	// WarmReady is, per template, how many warm-pool members are ready
	// to be claimed there now.
	WarmReady map[string]int `json:"warm_ready,omitempty"`
	// Heartbeat is when the record was last written, by the JetStream
	// server's clock (the KV entry's time; not the host's own clock, so
	// hosts' clock skew does not make a host lost). Set by List.
	Heartbeat time.Time `json:"-"`
	// Placeable reports whether placements may choose the host: ready,
	// and of a version compatible with the reader's (Compatible). Set by
	// List.
	Placeable bool `json:"-"`
}

// Capacity is a host's capacity.
type Capacity struct {
	// MemoryMB is the memory (MiB) its sessions' limits may add up to.
	MemoryMB int64 `json:"memory_mb"`
	// CPUs is the host's CPU count.
	CPUs int `json:"cpus"`
	// Sessions is the most sessions it runs at once (its session slots).
	Sessions int `json:"sessions"`
}

// Load is what a host runs.
type Load struct {
	// Sessions is how many sessions exist there (creating, running,
	// paused or ending; warm-pool members not counted).
	Sessions int `json:"sessions"`
	// MemoryMB is the sum of those sessions' memory limits, in MiB.
	MemoryMB int64 `json:"memory_mb,omitempty"`
	// Pooled is how many warm-pool members it holds ready. List reports
	// 0 for a lost host: its members are forgotten (not placed, not
	// listed).
	Pooled int `json:"pooled,omitempty"`
}

// RegistryOptions configure a Registry.
type RegistryOptions struct {
	// Heartbeat is how often this host rewrites its record (0:
	// DefaultHeartbeat).
	Heartbeat time.Duration
	// LostAfter is how long a record may go unrewritten before List
	// reports its host lost (0: DefaultLostAfter). It must exceed
	// Heartbeat.
	LostAfter time.Duration
	// Version is this host's forkbox version: List marks hosts of
	// another major/minor version not placeable (Compatible).
	Version string
	// Rejoin, when set, is what Run does before it writes the record
	// again after its writes failed for longer than LostAfter (the host
	// was cut off from the cluster's quorum, and the others may have
	// reported it lost and terminated its sessions): the host reconciles
	// before it takes placements again. While Rejoin fails, Run writes
	// no record (the host stays lost) and calls it again next beat. Once
	// the record is written again, Run calls Rejoin once more a LostAfter
	// later, beside the heartbeats: a watcher that had listed the host
	// lost may mark its sessions just after the first pass listed them
	// (or after the record was written), and that pass destroys them.
	Rejoin func(ctx context.Context) error
}

// Registry is the fleet's host registry: it keeps this host's record
// fresh (Run) and lists every host's (List). Safe for concurrent use.
type Registry struct {
	kv jetstream.KeyValue
	// drains is the bucket of drain requests (DrainsBucket).
	drains jetstream.KeyValue
	opts   RegistryOptions
	log    *slog.Logger

	mu   sync.Mutex
	last error // of the latest heartbeat
	// draining is this host's drain flag as last read (Run).
	draining bool
	// ran: Run has written or tried to; okSince is when its current run
	// of successful writes began (zero after a failure).
	ran     bool
	okSince time.Time
}

// OpenRegistry opens (creating when missing) the host registry's bucket
// on f, replicated f.Replicas() times, waiting up to ctx for a cluster
// still electing its leaders. A LostAfter not above Heartbeat is
// ErrInvalidArgument naming --host-lost-after.
func OpenRegistry(ctx context.Context, f *Fleet, opts RegistryOptions) (*Registry, error) {
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.LostAfter == 0 {
		opts.LostAfter = DefaultLostAfter
	}
	if opts.LostAfter <= opts.Heartbeat {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--host-lost-after %v: must exceed the heartbeat interval %v", opts.LostAfter, opts.Heartbeat)
	}
	var kv jetstream.KeyValue
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		kv, err = f.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: HostsBucket, Description: "forkbox hosts: one record per host, rewritten every heartbeat",
			History: 1, Replicas: f.replicas, Storage: jetstream.FileStorage,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: host registry: %w", err)
	}
	drains, err := openDrains(ctx, f)
	if err != nil {
		return nil, err
	}
	return &Registry{kv: kv, drains: drains, opts: opts, log: f.log}, nil
}

// LostAfter is how long a host's heartbeat may be missing before it is
// reported lost.
func (r *Registry) LostAfter() time.Duration { return r.opts.LostAfter }

// writable reports whether this host's own heartbeats (Run) have
// succeeded without a failure for at least LostAfter, so the bucket took
// writes all that time and a host whose record is older had its chance to
// write. Without Run (a registry only read) it reports true.
func (r *Registry) writable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.ran || (!r.okSince.IsZero() && time.Since(r.okSince) >= r.opts.LostAfter)
}

// writeTimeout bounds one heartbeat's reads and write: a third of
// LostAfter (5 s by default), at least the heartbeat interval. A write
// slower than the interval (a loaded host's JetStream, an fsync behind
// other writes) still lands well before the others take the host for
// lost, where one bounded by the interval would fail and, failing for a
// whole LostAfter, make a host that was only slow reconcile as if cut off.
func (r *Registry) writeTimeout() time.Duration {
	return max(r.opts.Heartbeat, r.opts.LostAfter/3)
}

// Put writes this host's record h now (its ID must be ValidID). The
// error is JetStream's (ErrUnavailable when the cluster has no quorum).
func (r *Registry) Put(ctx context.Context, h Host) error {
	if err := ValidID("host id", h.ID); err != nil {
		return err
	}
	if h.State == "" {
		h.State = HostReady
	}
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	_, err = r.kv.Put(ctx, h.ID, b)
	if err != nil {
		return fmt.Errorf("%w: fleet: write host %s: %v", errdefs.ErrUnavailable, h.ID, err)
	}
	return nil
}

// Run writes the record self returns at once and then every heartbeat
// until ctx ends, its State HostDraining while the host's drain flag is
// set (Drain). A failed write is logged (once per run of failures) and
// retried at the next beat: a host cut off from the cluster's quorum
// keeps trying and comes back by itself.
func (r *Registry) Run(ctx context.Context, self func() Host) {
	t := time.NewTicker(r.opts.Heartbeat)
	defer t.Stop()
	lastOK := time.Now() // the caller reconciled before the first Run
	// again fires a LostAfter after a Rejoin for the second pass (nil:
	// none due); second waits for one under way.
	var again <-chan time.Time
	var second sync.WaitGroup
	defer second.Wait()
	for {
		var err error
		if r.opts.Rejoin != nil && time.Since(lastOK) > r.opts.LostAfter {
			// Rejoin may destroy sandboxes: it has at least a minute.
			rctx, cancel := context.WithTimeout(ctx, max(r.opts.LostAfter, time.Minute))
			if err = r.opts.Rejoin(rctx); err == nil {
				lastOK = time.Now()
				again = time.After(r.opts.LostAfter)
			}
			cancel()
		}
		if err == nil {
			// The record is built before the write's deadline starts:
			// a host busy with creates may take a while to count them,
			// and that is not a failed write.
			h := self()
			wctx, cancel := context.WithTimeout(ctx, r.writeTimeout())
			if r.drainFlag(wctx, h.ID) {
				h.State = HostDraining
			}
			if err = r.Put(wctx, h); err == nil {
				lastOK = time.Now()
			}
			cancel()
		}
		r.mu.Lock()
		r.ran = true
		if err != nil {
			r.okSince = time.Time{}
		} else if r.okSince.IsZero() {
			r.okSince = time.Now()
		}
		if err != nil && r.last == nil && ctx.Err() == nil {
			r.log.Warn("fleet heartbeat failed; retrying", "err", err)
		} else if err == nil && r.last != nil {
			r.log.Info("fleet heartbeat written again")
		}
		r.last = err
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-again:
			again = nil
			second.Add(1)
			go func() {
				defer second.Done()
				rctx, cancel := context.WithTimeout(ctx, max(r.opts.LostAfter, time.Minute))
				defer cancel()
				if err := r.opts.Rejoin(rctx); err != nil && ctx.Err() == nil {
					r.log.Warn("fleet: second reconcile after rejoining failed", "err", err)
				}
			}()
		}
	}
}

// List returns every host's record, sorted by id, with State HostLost for
// those whose heartbeat is older than LostAfter (their Load.Pooled 0),
// HostDraining for the others whose drain flag is set (also before the
// host's next heartbeat says so), and Heartbeat and Placeable set. The
// error is ErrUnavailable when the bucket cannot be read (no quorum).
func (r *Registry) List(ctx context.Context) ([]Host, error) {
	drained, err := r.drainFlags(ctx)
	if err != nil {
		return nil, err
	}
	// One pass over the bucket: the watcher sends each key's latest
	// entry, then nil once it is caught up.
	w, err := r.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("%w: fleet: list hosts: %v", errdefs.ErrUnavailable, err)
	}
	defer w.Stop()
	var entries []jetstream.KeyValueEntry
	for done := false; !done; {
		select {
		case e := <-w.Updates():
			if e == nil {
				done = true
			} else {
				entries = append(entries, e)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: fleet: list hosts: %v", errdefs.ErrUnavailable, ctx.Err())
		}
	}
	now := time.Now()
	out := make([]Host, 0, len(entries))
	for _, e := range entries {
		k := e.Key()
		var h Host
		if err := json.Unmarshal(e.Value(), &h); err != nil {
			r.log.Warn("fleet: unreadable host record skipped", "host", k, "err", err)
			continue
		}
		h.ID = k
		h.Heartbeat = e.Created()
		switch {
		case now.Sub(h.Heartbeat) > r.opts.LostAfter:
			h.State, h.Load.Pooled = HostLost, 0
		case drained[k]:
			h.State = HostDraining
		case h.State == HostDraining:
			// Undrained since its last heartbeat: ready with the next.
			h.State = HostReady
		}
		h.Placeable = h.State == HostReady && Compatible(r.opts.Version, h.Version)
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Forget removes host id's record (a host taken out of the fleet for
// good); a missing record is fine.
func (r *Registry) Forget(ctx context.Context, id string) error {
	if err := r.kv.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("%w: fleet: forget host %s: %v", errdefs.ErrUnavailable, id, err)
	}
	return nil
}
