package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/freeport"
)

// GroupRoute is the fleet's routing rows: two private daemons, hosts a
// and b of one cluster (with a third NATS node that runs no daemon, so
// that the buckets have their three replicas), b taking no sessions
// itself. A create through b is placed on a and forwarded there, beside
// a create through a itself; an exec of `true` through b in a session
// on a, beside the same exec through a. Not in DefaultGroups (two more
// daemons); needs no other daemon.
const GroupRoute = "route"

// The route rows' operations; the routed calls are their SystemRouted
// rows.
const (
	// OpFleetCreate is a cold create (no warm pool) placed on host a.
	OpFleetCreate = "fleet: create placed on host a"
	// OpFleetExec is an exec of `true` in a session on host a.
	OpFleetExec = "fleet: exec true in a session on host a"
)

// SystemRouted is a call made through another host of the fleet, which
// forwards it to the owner (the route rows).
const SystemRouted = "routed"

// routeExecTargetMS is the most routing may add to an exec at p50, in
// milliseconds (DESIGN.md's targets: "routing adds < 1 ms p50 to an
// exec").
const routeExecTargetMS = 1.0

// routeStorageBytes sizes each route daemon's storage image when
// Options.StorageImageBytes does not.
const routeStorageBytes = 2 << 30

// routeWaitTimeout bounds how long the route group waits for the two
// daemons to see each other in the registry and to forward a create.
const routeWaitTimeout = 2 * time.Minute

// measureRoute measures the route rows (GroupRoute).
func (e *env) measureRoute(ctx context.Context) (rows []Result) {
	ops := []string{OpFleetCreate, OpFleetExec}
	hosts, cleanup, err := e.startRouteFleet(ctx)
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer func() {
		if err := cleanup(); err != nil {
			rows = append(rows, Result{Operation: OpFleetCreate, System: SystemForkbox, Error: "clean up: " + err.Error()})
		}
	}()
	a, b := hosts[0], hosts[1]
	// The exec target, created through b and placed on a: until b's
	// registry lists a (the cluster formed, both heartbeats in), b
	// places its creates itself; those are destroyed and tried again.
	var target string
	deadline := time.Now().Add(routeWaitTimeout)
	for target == "" {
		s, _, err := b.createWith(ctx, client.CreateRequest{})
		var on string
		if err == nil {
			if on, err = hostOf(ctx, b, s.ID); err == nil && on == "a" {
				target = s.ID
				break
			}
			_, _ = b.destroy(ctx, s.ID)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return failOps(ops, SystemForkbox, fmt.Errorf("host b never placed a create on a (last on %q: %v)", on, err))
		}
		time.Sleep(500 * time.Millisecond)
	}
	// b finds the target through the directory once a's entry for it
	// is there (a cluster's first creates come before a's directory is
	// open: its sync writes them later).
	for {
		_, err := b.exec(ctx, target)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return failOps(ops, SystemForkbox, fmt.Errorf("host b never found the session on a: %w", err))
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Each round destroys its session through its owner a: a destroy
	// through b right after the create may not find it yet (a writes
	// its directory entry after the create has answered).
	createOn := func(f *forkbox) func(ctx context.Context) ([]time.Duration, error) {
		return func(ctx context.Context) ([]time.Duration, error) {
			s, d, err := f.createWith(ctx, client.CreateRequest{})
			if err != nil {
				return nil, err
			}
			if _, err := a.destroy(ctx, s.ID); err != nil {
				return nil, err
			}
			f.untrack(s.ID)
			x, err := f.exec(ctx, target)
			return []time.Duration{d, x}, err
		}
	}
	e.opts.progressf("route: create and exec x %d on host a, through b and through a itself", e.opts.Warmup+e.opts.N)
	rows = interleave(ctx, e.opts.Warmup, e.opts.N, ops, []contender{
		{system: SystemForkbox, step: createOn(a)},
		{system: SystemRouted, step: createOn(b)},
	})
	local := map[string]float64{}
	for _, r := range rows {
		if r.System == SystemForkbox && r.Error == "" {
			local[r.Operation] = r.P50MS
		}
	}
	for i, r := range rows {
		switch {
		case r.Error != "":
		case r.System == SystemForkbox:
			rows[i].Note = "through host a itself; routed: through host b, which forwards to a"
		case r.System == SystemRouted:
			// The paired ratio (round by round) is steadier on a loaded
			// machine than the difference of the two p50s.
			added := r.P50MS - local[r.Operation]
			if r.PairedRatio != nil {
				added = local[r.Operation] * (*r.PairedRatio - 1)
			}
			rows[i].Note = fmt.Sprintf("adds %.2f ms at p50 (a's p50 x (paired ratio - 1))", added)
			if r.Operation == OpFleetExec {
				verdict := "met"
				if added >= routeExecTargetMS {
					verdict = "MISSED"
				}
				rows[i].Note += fmt.Sprintf(" (target < %g: %s)", routeExecTargetMS, verdict)
			}
		}
	}
	return rows
}

// startRouteFleet starts the route group's fleet: a third NATS node
// (no daemon) and two private daemons a and b in cluster mode on
// loopback ports, b with no room for a session of its own. cleanup
// stops them (b first: it forwards to a) and removes their data.
func (e *env) startRouteFleet(ctx context.Context) (hosts []*forkbox, cleanup func() error, err error) {
	var third *fleet.Fleet
	dir, err := os.MkdirTemp("", "forkbox-bench-route-")
	if err != nil {
		return nil, nil, err
	}
	cleanup = func() error {
		var errs []error
		for i := len(hosts) - 1; i >= 0; i-- {
			if err := hosts[i].close(context.WithoutCancel(ctx)); err != nil {
				errs = append(errs, fmt.Errorf("host %d: %w", i, err))
			}
		}
		if third != nil {
			third.Close()
		}
		if len(errs) == 0 {
			errs = append(errs, os.RemoveAll(dir))
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, cleanup())
		}
	}()
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, cleanup, err
	}
	ports, err := freeport.LoopbackN(3)
	if err != nil {
		return nil, cleanup, err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return nil, cleanup, err
	}
	secret := hex.EncodeToString(raw)
	ids := []string{"a", "b", "c"}
	nats := func(i int) fleet.Options {
		var peers []fleet.Peer
		for j, id := range ids {
			if j != i {
				peers = append(peers, fleet.Peer{ID: id, Addr: fmt.Sprintf("127.0.0.1:%d", ports[j])})
			}
		}
		return fleet.Options{Cluster: "bench-route", NodeID: ids[i], Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]),
			Peers: peers, Secret: secret}
	}
	opts := nats(2)
	opts.StoreDir = filepath.Join(dir, "c")
	third, err = fleet.Start(ctx, opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, cleanup, fmt.Errorf("NATS node c: %w", err)
	}
	for i := range 2 {
		o := e.opts
		o.DataDir = filepath.Join(dir, ids[i])
		// No spares: a spare would be refilled during the next round.
		o.Spares = 0
		if o.StorageImageBytes == 0 {
			o.StorageImageBytes = routeStorageBytes
		}
		f := &forkbox{opts: o, runID: newRunID(), live: map[string]bool{}, snaps: map[string]bool{},
			files: map[int]filesSnap{}, fleet: daemon.FleetOptions{NATS: nats(i)}}
		if i == 1 {
			// Host b takes no session: its record's memory capacity
			// fits none, so every create through it is placed on a.
			f.capacity = &admission.Capacity{MaxSessions: 1, MaxMemoryMB: 1}
		}
		// Its data directory is the run's: the daemon stops every
		// sandbox at shutdown, and close unmounts the storage and
		// removes it.
		f.removeDir = true
		if err := f.startDaemon(ctx); err != nil {
			return hosts, cleanup, fmt.Errorf("host %s: %w", ids[i], err)
		}
		hosts = append(hosts, f)
	}
	return hosts, cleanup, nil
}

// newRunID is a run id for a route daemon's sessions (benchLabel).
func newRunID() string {
	raw := make([]byte, 4)
	_, _ = rand.Read(raw)
	return hex.EncodeToString(raw)
}

// hostOf returns the host the fleet's session list through f says
// session id is on ("" when the list does not have it).
func hostOf(ctx context.Context, f *forkbox, id string) (string, error) {
	key, err := os.ReadFile(f.d.KeyFile)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.c.BaseURL()+"/v1/sessions", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(key)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /v1/sessions: %s", resp.Status)
	}
	var body struct {
		Sessions []struct {
			ID   string `json:"id"`
			Host string `json:"host"`
		} `json:"sessions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", fmt.Errorf("GET /v1/sessions: %w", err)
	}
	for _, s := range body.Sessions {
		if s.ID == id {
			return s.Host, nil
		}
	}
	return "", nil
}
