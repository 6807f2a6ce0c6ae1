package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/version"
)

// The fleet simulation (GroupFleetSim): a real three-node JetStream
// cluster (fleet.Start in cluster mode on loopback ports, in this
// process) and many simulated hosts, goroutines each heartbeating its
// fleet.Host record every fleet.DefaultHeartbeat through fleet.Registry,
// under a placement load: creates at a fixed rate, each reading the
// hosts (fleet.Registry.List, or the front host's fleet.HostView), picking
// one and writing a fleet.Location to fleet.Directory by the owning host,
// and destroys at the same rate deleting the oldest entries, around a
// steady population of live sessions written before the step starts.

// simNodes is how many NATS nodes the simulated cluster has (the R3
// buckets' replicas).
const simNodes = 3

// simMaxInflight bounds the creates (and destroys) in flight at once;
// past it the schedule waits, and the wait shows in the latencies,
// which are taken from each operation's scheduled time.
const simMaxInflight = 1024

// simOpTimeout bounds one create or destroy.
const simOpTimeout = 30 * time.Second

// simSlack is how much more than its share of the live sessions a
// simulated host can hold (its Capacity.Sessions).
const simSlack = 1.5

// simRead is how a create reads the hosts.
type simRead int

const (
	// readView reads the front host's fleet.HostView (one watch per
	// host, kept open).
	readView simRead = iota
	// readTTL reads the front host's copy of Registry.List, listed
	// again when it is a second old (a router's host cache).
	readTTL
	// readList calls Registry.List for every create.
	readList
)

// simReads are the read modes, in the order a scale's steps run them.
var simReads = []simRead{readView, readTTL, readList}

func (m simRead) String() string {
	switch m {
	case readView:
		return "cached view"
	case readTTL:
		return "List cached 1 s"
	}
	return "List per create"
}

// simStep is one step of the simulation.
type simStep struct {
	hosts  int
	rate   float64 // creates a second, and as many destroys
	live   int     // sessions live when the step starts
	read   simRead
	warmup time.Duration
	length time.Duration // measured, after warmup
}

// simTally is what one step measured. Latencies run from each
// operation's scheduled time to its end.
type simTally struct {
	mu                                      sync.Mutex
	place, read, write, heartbeat, destroy  []time.Duration
	creates, destroys, heartbeats, missedHB int
	lists                                   int // Registry.List calls
	errs                                    int
	firstErr                                error
	elapsed                                 time.Duration
	cpuSeconds                              float64 // this process's CPU over the measured time
	busySeconds                             float64 // the machine's (every process's) over it
	profile                                 *cpuSplit
	diskBytes                               int64
	liveAtEnd                               int
	// The buckets at the end: messages (the directory's: live entries
	// and the delete markers destroys leave) and bytes, 0 when unread.
	dirMsgs, dirBytes, hostsBytes uint64
}

func (t *simTally) fail(err error) {
	t.mu.Lock()
	t.errs++
	if t.firstErr == nil {
		t.firstErr = err
	}
	t.mu.Unlock()
}

// simHost is one simulated host.
type simHost struct {
	id   string
	node int          // the node its daemon talks to
	load atomic.Int64 // its live sessions
	view *fleet.HostView

	mu     sync.Mutex // the readTTL copy
	listed time.Time
	copy   []fleet.Host
}

// ttlHosts returns h's copy of the registry, listed again through reg
// when it is older than a second (one List at a time per host), and
// whether it listed.
func (h *simHost) ttlHosts(ctx context.Context, reg *fleet.Registry) ([]fleet.Host, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.copy != nil && time.Since(h.listed) < time.Second {
		return h.copy, false, nil
	}
	hs, err := reg.List(ctx)
	if err != nil {
		return nil, true, err
	}
	h.copy, h.listed = hs, time.Now()
	return hs, true, nil
}

// simRun is the state of one running step.
type simRun struct {
	step     simStep
	c        *simCluster
	regs     []*fleet.Registry // one per node
	dirs     []*fleet.Directory
	hosts    []*simHost
	byID     map[string]*simHost
	capacity int
	counting atomic.Bool
	t        *simTally

	mu   sync.Mutex
	live []simSession // FIFO: destroys take the oldest
	seq  atomic.Int64
}

type simSession struct {
	id   string
	host *simHost
}

// runStep runs one step on c (whose buckets must be empty) and returns
// what it measured. An error is a step that could not start; errors of
// single operations are counted in the tally.
func runStep(ctx context.Context, c *simCluster, st simStep) (*simTally, error) {
	r := &simRun{step: st, c: c, t: &simTally{}, byID: map[string]*simHost{}}
	r.capacity = int(float64(st.live)/float64(st.hosts)*simSlack) + 1
	for _, f := range c.nodes {
		reg, err := fleet.OpenRegistry(ctx, f, fleet.RegistryOptions{Version: version.String()})
		if err != nil {
			return nil, err
		}
		d, err := fleet.OpenDirectory(ctx, f)
		if err != nil {
			return nil, err
		}
		r.regs, r.dirs = append(r.regs, reg), append(r.dirs, d)
	}
	for i := range st.hosts {
		h := &simHost{id: fmt.Sprintf("sim-%04d", i), node: i % len(c.nodes)}
		r.hosts = append(r.hosts, h)
		r.byID[h.id] = h
	}
	if err := r.prefill(ctx); err != nil {
		return nil, err
	}
	// Every host's first record before any placement reads them.
	for _, h := range r.hosts {
		if err := r.regs[h.node].Put(ctx, r.record(h)); err != nil {
			return nil, err
		}
	}
	if st.read == readView {
		defer func() {
			for _, h := range r.hosts {
				if h.view != nil {
					h.view.Close()
				}
			}
		}()
		for _, h := range r.hosts {
			v, err := r.regs[h.node].View(ctx)
			if err != nil {
				return nil, err
			}
			h.view = v
		}
	}

	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, h := range r.hosts {
		wg.Add(1)
		go func() { defer wg.Done(); r.heartbeat(sctx, h) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); r.schedule(sctx, ctx, &wg, r.create) }()
	go func() { defer wg.Done(); r.schedule(sctx, ctx, &wg, r.destroyOldest) }()

	select {
	case <-ctx.Done():
	case <-time.After(st.warmup):
	}
	prof := startCPUProfile()
	busy0, _ := hostBusy()
	cpu0, t0 := selfCPU(), time.Now()
	r.counting.Store(true)
	select {
	case <-ctx.Done():
	case <-time.After(st.length):
	}
	r.counting.Store(false)
	r.t.elapsed, r.t.cpuSeconds = time.Since(t0), selfCPU()-cpu0
	if busy1, err := hostBusy(); err == nil && busy0 > 0 {
		r.t.busySeconds = busy1 - busy0
	}
	r.t.profile = prof.stop()
	stop()
	wg.Wait()
	r.t.diskBytes = c.diskBytes()
	r.t.dirMsgs, r.t.dirBytes = c.bucketSize(ctx, fleet.LocationsBucket)
	_, r.t.hostsBytes = c.bucketSize(ctx, fleet.HostsBucket)
	r.mu.Lock()
	r.t.liveAtEnd = len(r.live)
	r.mu.Unlock()
	return r.t, ctx.Err()
}

// record is h's registry record now.
func (r *simRun) record(h *simHost) fleet.Host {
	return fleet.Host{ID: h.id, API: "http://" + h.id + ".bench.invalid:7070", Version: version.String(),
		Tiers: []string{"runc", "gvisor"}, State: fleet.HostReady,
		Capacity: fleet.Capacity{MemoryMB: 256 << 10, CPUs: 64, Sessions: r.capacity},
		Load:     fleet.Load{Sessions: int(h.load.Load())}}
}

// prefill writes the step's live sessions, spread evenly over the hosts,
// 64 writes at a time.
func (r *simRun) prefill(ctx context.Context) error {
	r.live = make([]simSession, r.step.live)
	for i := range r.live {
		h := r.hosts[i%len(r.hosts)]
		h.load.Add(1)
		r.live[i] = simSession{id: r.nextID(), host: h}
	}
	rand.Shuffle(len(r.live), func(i, j int) { r.live[i], r.live[j] = r.live[j], r.live[i] })
	work := make(chan simSession)
	errc := make(chan error, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				if err := r.dirs[s.host.node].Put(ctx, r.location(s)); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}
		}()
	}
	for _, s := range r.live {
		work <- s
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		return fmt.Errorf("prefill the directory: %w", err)
	default:
		return nil
	}
}

func (r *simRun) nextID() string { return fmt.Sprintf("s%019d", r.seq.Add(1)) }

func (r *simRun) location(s simSession) fleet.Location {
	return fleet.Location{Kind: fleet.KindSession, ID: s.id, Host: s.host.id}
}
