package daemon

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/host"
	"github.com/forkbox/forkbox/internal/version"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/snapshot"
	"github.com/forkbox/forkbox/template"
)

// FleetOptions place the host in a fleet (package fleet). The zero value
// is one host alone: an embedded NATS server with JetStream that listens
// on no port, its store in the data directory.
type FleetOptions struct {
	// NATS is the fleet connection: cluster name, node id, peers, route
	// address and secret, or the URL of an existing NATS (fleet.Options;
	// StoreDir is set by the daemon).
	NATS fleet.Options
	// LostAfter is how long a host's heartbeat may be missing before the
	// registry reports it lost (0: fleet.DefaultLostAfter).
	LostAfter time.Duration
	// Heartbeat is how often this host rewrites its registry record (0:
	// fleet.DefaultHeartbeat).
	Heartbeat time.Duration
	// APIURL is the base URL other hosts reach this host's API at, as
	// its registry record says ("": the URL of the address the API
	// listens on, Daemon.URL).
	APIURL string
	// ReplicateAlone copies sealed memory checkpoints to the object store
	// also when the host is alone (no --cluster, no --nats). Off by
	// default: a host alone would only keep a second copy of every
	// checkpoint on its own disk; in a fleet they are always copied.
	ReplicateAlone bool
	// CacheMB bounds, in MiB, the local cache of other hosts' snapshots
	// pulled from the fleet's object store (fleet.Cache; least recently
	// used evicted first). 0: DefaultSnapshotCacheMB.
	CacheMB int
}

// DefaultSnapshotCacheMB is the default bound of the cache of pulled
// snapshots (--snapshot-cache-mb), in MiB.
const DefaultSnapshotCacheMB = 4096

// fleetHost is the daemon's part of the fleet: the connection and this
// host's heartbeat in the registry. It serves GET /v1/hosts
// (api.HostLister).
type fleetHost struct {
	f   *fleet.Fleet
	reg atomic.Pointer[fleet.Registry]
	// objects is the snapshot object store once open (alone: at start;
	// in a cluster: once it has a quorum).
	objects atomic.Pointer[fleet.JetStreamObjects]
	// dir is the fleet's directory of sessions and snapshots once open
	// (alone: at start; in a cluster: once it has a quorum).
	dir atomic.Pointer[fleet.Directory]
	// view is the router's in-memory copy of the host registry
	// (viewHosts), opened on first use.
	viewMu sync.Mutex
	view   *fleet.HostView
	// cache holds other hosts' snapshots pulled from the object store
	// (fleetreplicas.go).
	cache *fleet.Cache
	log   *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// replicate: sealed memory checkpoints are copied to the object
	// store (FleetOptions.ReplicateAlone).
	replicate bool
	// destroy tears a local session down (the host's Destroy): what
	// reconcile does to the sessions the fleet gave up on (fleetlost.go).
	// Set before heartbeat.
	destroy func(ctx context.Context, id string) error
	// destroyMu and destroyStopped: no destroy once the daemon stops
	// (stopDestroys).
	destroyMu      sync.RWMutex
	destroyStopped bool
}

// startFleet connects the host to the fleet per opts (the JetStream store
// in layout's fleet directory). A bad option is ErrInvalidArgument
// naming its flag.
func startFleet(ctx context.Context, opts FleetOptions, layout datadir.Layout, log *slog.Logger) (*fleetHost, error) {
	hb, lost := opts.Heartbeat, opts.LostAfter
	if hb <= 0 {
		hb = fleet.DefaultHeartbeat
	}
	if lost == 0 {
		lost = fleet.DefaultLostAfter
	}
	if lost <= hb {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--host-lost-after %v: must exceed the heartbeat interval %v", lost, hb)
	}
	o := opts.NATS
	o.StoreDir = layout.FleetStore()
	f, err := fleet.Start(ctx, o, log)
	if err != nil {
		return nil, err
	}
	fh := &fleetHost{f: f, log: log, replicate: f.Clustered() || o.URL != "" || opts.ReplicateAlone}
	if err := fh.openCache(opts, layout); err != nil {
		f.Close()
		return nil, err
	}
	if !f.Clustered() {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		objs, err := fleet.OpenObjects(octx, f)
		if err != nil {
			f.Close()
			return nil, err
		}
		fh.objects.Store(objs)
		dir, err := fleet.OpenDirectory(octx, f)
		if err != nil {
			f.Close()
			return nil, err
		}
		fh.dir.Store(dir)
	}
	return fh, nil
}

// replicas is the snapshot service's way to the fleet (snapshot.Replicas:
// the object store, the directory and the cache of pulled snapshots; each
// ErrUnavailable until open); nil when snapshots are not copied (a host
// alone).
func (fh *fleetHost) replicas() snapshot.Replicas {
	if !fh.replicate {
		return nil
	}
	return &fleet.SnapshotReplicas{Self: fh.f.NodeID(), Objects: lazyObjects{fh}, Directory: fh.directory, Cache: fh.cache, Log: fh.log}
}

// heartbeat opens the host registry and keeps self's record in it until
// close. Alone, the registry is opened and the first record written
// before it returns (an error then fails the start); in a cluster that
// waits for the cluster's quorum in the background, so a host can start
// before its peers.
func (fh *fleetHost) heartbeat(ctx context.Context, opts FleetOptions, self func() fleet.Host) error {
	ropts := fleet.RegistryOptions{Heartbeat: opts.Heartbeat, LostAfter: opts.LostAfter, Version: version.String(),
		Rejoin: fh.rejoinAfterCut}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	fh.cancel = cancel
	if !fh.f.Clustered() {
		octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
		defer ocancel()
		reg, err := fleet.OpenRegistry(octx, fh.f, ropts)
		if err != nil {
			return err
		}
		if dir := fh.dir.Load(); dir != nil {
			fh.rejoin(octx, runCtx, reg, dir)
		}
		if err := reg.Put(octx, self()); err != nil {
			return err
		}
		fh.reg.Store(reg)
		fh.wg.Add(1)
		go func() { defer fh.wg.Done(); reg.Run(runCtx, self) }()
		return nil
	}
	fh.wg.Add(1)
	go func() {
		defer fh.wg.Done()
		for runCtx.Err() == nil {
			reg, err := fleet.OpenRegistry(runCtx, fh.f, ropts)
			if err != nil {
				if runCtx.Err() == nil {
					fh.log.Warn("fleet: host registry not available yet; retrying", "err", err)
				}
				pause(runCtx)
				continue
			}
			fh.reg.Store(reg)
			fh.log.Info("fleet: host registry open", "node", fh.f.NodeID(), "replicas", fh.f.Replicas())
			fh.wg.Add(1)
			go func() { defer fh.wg.Done(); fh.openObjects(runCtx) }()
			// The directory before the first heartbeat: the host
			// reconciles before it takes placements (rejoin).
			fh.openDirectory(runCtx)
			if dir := fh.dir.Load(); dir != nil {
				fh.rejoin(runCtx, runCtx, reg, dir)
			}
			reg.Run(runCtx, self)
			return
		}
	}()
	return nil
}

// openObjects opens the snapshot object store of a cluster, retrying
// until it has a quorum or ctx ends.
func (fh *fleetHost) openObjects(ctx context.Context) {
	for ctx.Err() == nil {
		objs, err := fleet.OpenObjects(ctx, fh.f)
		if err == nil {
			fh.objects.Store(objs)
			return
		}
		if ctx.Err() == nil {
			fh.log.Warn("fleet: snapshot object store not available yet; retrying", "err", err)
		}
		pause(ctx)
	}
}

// openDirectory opens the directory of a cluster, retrying until it has
// a quorum or ctx ends.
func (fh *fleetHost) openDirectory(ctx context.Context) {
	for ctx.Err() == nil {
		dir, err := fleet.OpenDirectory(ctx, fh.f)
		if err == nil {
			fh.dir.Store(dir)
			fh.log.Info("fleet: directory open", "node", fh.f.NodeID())
			return
		}
		if ctx.Err() == nil {
			fh.log.Warn("fleet: directory not available yet; retrying", "err", err)
		}
		pause(ctx)
	}
}

// directory returns the fleet's directory of sessions and snapshots, or
// ErrUnavailable while a cluster has no quorum yet.
func (fh *fleetHost) directory() (*fleet.Directory, error) {
	if d := fh.dir.Load(); d != nil {
		return d, nil
	}
	return nil, errdefs.Newf(errdefs.ErrUnavailable, "the fleet's directory is not available yet (the cluster has no quorum)")
}

// pause waits a second or until ctx ends.
func pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
}

// Self implements api.HostLister.
func (fh *fleetHost) Self() string { return fh.f.NodeID() }

// Hosts implements api.HostLister: ErrUnavailable until the registry is
// open.
func (fh *fleetHost) Hosts(ctx context.Context) ([]fleet.Host, error) {
	reg := fh.reg.Load()
	if reg == nil {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "the fleet's host registry is not available yet (the cluster has no quorum)")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return reg.List(ctx)
}

// viewHosts is the router's read of the host registry: a fleet.HostView
// kept open (reopened when its watch ends), so a placement or a route
// costs no JetStream request (docs/SCALING.md: a List per create is what
// breaks first at the design's rate). It sees a drain once the drained
// host writes its record draining (its next heartbeat), where List reads
// the drain flag at once. ErrUnavailable until the registry is open.
func (fh *fleetHost) viewHosts(ctx context.Context) ([]fleet.Host, error) {
	reg := fh.reg.Load()
	if reg == nil {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "the fleet's host registry is not available yet (the cluster has no quorum)")
	}
	fh.viewMu.Lock()
	defer fh.viewMu.Unlock()
	if fh.view == nil || fh.view.Ended() {
		if fh.view != nil {
			fh.view.Close()
			fh.view = nil
		}
		vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := reg.View(vctx)
		cancel()
		if err != nil {
			return nil, err
		}
		fh.view = v
	}
	return fh.view.Hosts(), nil
}

// close stops the heartbeat and the fleet connection (the embedded
// server with it). The host's record stays; without heartbeats it is
// reported lost after LostAfter.
func (fh *fleetHost) close() {
	if fh.cancel != nil {
		fh.cancel()
	}
	fh.wg.Wait()
	fh.viewMu.Lock()
	if fh.view != nil {
		fh.view.Close()
	}
	fh.viewMu.Unlock()
	fh.f.Close()
}

// hostRecord returns the function that makes this host's registry
// record: its id, API URL, version, tiers, capacity and load now, and
// for placement its templates and ready warm-pool members.
func hostRecord(id, apiURL string, mgr *host.Node, catalog *template.Catalog, capacity admission.Capacity) func() fleet.Host {
	started := time.Now()
	var tiers []string
	for _, d := range mgr.Info().Drivers {
		tiers = append(tiers, d.Name)
	}
	return func() fleet.Host {
		n, pooled := 0, 0
		for state, c := range mgr.SessionStates() {
			if state == string(node.StatePooled) {
				pooled += c
			} else {
				n += c
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var memMB int64
		if live, err := mgr.List(ctx, node.SessionFilter{States: []node.State{node.StateCreating, node.StateRunning,
			node.StatePaused, node.StateTerminating}}); err == nil {
			for _, s := range live {
				memMB += s.MemoryMB
			}
		}
		var templates []string
		if ts, err := catalog.List(ctx); err == nil {
			templates = []string{}
			for _, t := range ts {
				templates = append(templates, t.Name)
			}
		}
		warm := map[string]int{}
		for _, p := range mgr.PoolList() {
			if p.Ready > 0 {
				warm[p.Template] += p.Ready
			}
		}
		return fleet.Host{
			ID: id, API: apiURL, Version: version.String(), Tiers: tiers, State: fleet.HostReady, Started: started,
			Capacity:  fleet.Capacity{MemoryMB: capacity.MaxMemoryMB, CPUs: runtime.NumCPU(), Sessions: capacity.MaxSessions},
			Load:      fleet.Load{Sessions: n, MemoryMB: memMB, Pooled: pooled},
			Templates: templates, WarmReady: warm,
		}
	}
}
