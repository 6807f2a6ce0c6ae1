package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/defaults"
)

// benchLabel is the metadata key put on every session the benchmark
// creates; its value is the run's id, so leftovers can be recognised.
const benchLabel = "forkbox-bench"

const (
	// closeParallel is how many sessions are destroyed at once when many
	// are (the idle rows, clean-up).
	closeParallel = 8
	// perSessionCleanup is added to cleanupTimeout per session left to
	// destroy at the end.
	perSessionCleanup = 200 * time.Millisecond
)

// forkbox is the forkbox side of a run: a client of the daemon under test
// and, for a private daemon, the daemon and its data directory. create,
// destroy, exec and the snapshot calls may be used from several goroutines
// at once; the rest may not.
type forkbox struct {
	opts  Options
	c     *client.Client
	runID string // value of the benchLabel metadata

	mu    sync.Mutex
	live  map[string]bool   // sessions created and not destroyed yet
	snaps map[string]bool   // snapshots taken and not deleted yet
	files map[int]filesSnap // files snapshots by MB written, reused by the fork rows

	storage   string // storage driver of the snapshots taken ("" before one)
	snapBytes int64  // SizeBytes of the last snapshot taken
	// poolPrev holds the pools the benchmark changed, by template, as
	// they were before (nil: there was none).
	poolPrev map[string]*client.Pool

	d         *daemon.Daemon  // the private daemon; nil for a running one
	dataDir   string          // the private daemon's data directory
	removeDir bool            // dataDir was made by Run and is removed at the end
	upstream  *brokerUpstream // the broker rows' server certificate (private daemon only)

	// fleet and capacity, when set, are the private daemon's fleet
	// options and capacity (the route group's hosts).
	fleet    daemon.FleetOptions
	capacity *admission.Capacity
}

// openForkbox connects to the daemon named by opts (URL or FORKBOX_URL) or,
// when there is none, starts a private one.
func openForkbox(ctx context.Context, opts Options) (*forkbox, error) {
	raw := make([]byte, 4)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("run id: %w", err)
	}
	f := &forkbox{opts: opts, runID: hex.EncodeToString(raw), live: map[string]bool{}, snaps: map[string]bool{},
		files: map[int]filesSnap{}}
	base := opts.URL
	if base == "" {
		base = os.Getenv(client.EnvURL)
	}
	if base == "" {
		return f, f.startDaemon(ctx)
	}
	if opts.Storage != "" {
		return nil, fmt.Errorf("storage %q: only a private daemon's storage can be chosen (not with a daemon URL)", opts.Storage)
	}
	key, err := apiKey(opts, base)
	if err != nil {
		return nil, err
	}
	f.c = client.New(base, key, nil)
	if _, err := f.c.Info(ctx); err != nil {
		return nil, fmt.Errorf("reach the daemon at %s: %w", base, err)
	}
	opts.progressf("measuring the running daemon at %s", base)
	return f, nil
}

// apiKey returns the key for the daemon at base: opts.APIKey, else
// FORKBOX_API_KEY, else (for a daemon on this host) the key file.
func apiKey(opts Options, base string) (string, error) {
	if opts.APIKey != "" {
		return opts.APIKey, nil
	}
	if k := os.Getenv(client.EnvAPIKey); k != "" {
		return k, nil
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("daemon URL %q: %w", base, err)
	}
	switch u.Hostname() {
	case "127.0.0.1", "localhost", "::1":
	default:
		return "", fmt.Errorf("no API key for %s: pass --api-key or set %s", base, client.EnvAPIKey)
	}
	file := opts.APIKeyFile
	if file == "" {
		file = defaults.KeyFile
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("no API key: pass --api-key, set %s, or run as root beside the daemon: %w", client.EnvAPIKey, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// startDaemon starts a private daemon on 127.0.0.1 (any free port) with
// its own data directory and connects f to it.
func (f *forkbox) startDaemon(ctx context.Context) (retErr error) {
	f.dataDir = f.opts.DataDir
	if f.dataDir == "" {
		dir, err := os.MkdirTemp("", "forkbox-bench-*")
		if err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		f.dataDir, f.removeDir = dir, true
	} else if err := os.MkdirAll(f.dataDir, 0o711); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	defer func() {
		if retErr != nil && f.removeDir {
			os.RemoveAll(f.dataDir)
		}
	}()
	// Sandbox processes run as unprivileged host ids and must traverse it.
	if err := os.Chmod(f.dataDir, 0o711); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	up, err := newBrokerUpstream()
	if err != nil {
		return fmt.Errorf("the broker rows' certificate: %w", err)
	}
	caFile, err := up.writeUpstreamCA(f.dataDir)
	if err != nil {
		return fmt.Errorf("the broker rows' CA: %w", err)
	}
	f.upstream = up
	capacity := admission.Capacity{MaxSessions: max(daemon.DefaultCapacity().MaxSessions,
		max(f.opts.IdleRunc, f.opts.IdleGVisor)+fork64Count+poolSize)}
	if f.capacity != nil {
		capacity = *f.capacity
	}
	start := time.Now()
	d, err := daemon.Start(ctx, daemon.Options{
		DataDir: f.dataDir, Listen: "127.0.0.1:0", AgentPath: f.opts.AgentPath, Storage: f.opts.Storage,
		StorageImageBytes: f.opts.StorageImageBytes,
		Log:               f.opts.logger(),
		// Room for the idle rows' sessions beside the largest fork.
		Capacity: capacity,
		Fleet:    f.fleet,
		// A data directory of the run's own goes with it: nothing of it
		// may stay on the host (its nftables table, cgroup parent).
		StopSessions: f.removeDir,
		Spares:       f.opts.Spares,
		// As forkbox serve keeps by default.
		MemoryImageCacheMB: defaults.MemoryImageCacheMB,
		// The egress rows' server (egress.go), and nothing else.
		EgressResolver: egressResolver, EgressTestNetworks: egressTestNetworks, BrokerUpstreamCA: caFile,
	})
	if err != nil {
		return fmt.Errorf("start a private daemon: %w", err)
	}
	f.d = d
	b, err := os.ReadFile(d.KeyFile)
	if err != nil {
		return errors.Join(fmt.Errorf("read the private daemon's API key: %w", err), f.close(ctx))
	}
	f.c = client.New(d.URL, strings.TrimSpace(string(b)), nil)
	f.opts.progressf("private daemon at %s ready in %.0f ms (data dir %s)",
		d.URL, float64(time.Since(start))/float64(time.Millisecond), f.dataDir)
	return nil
}

// describe returns the daemon's version and driver and where it runs.
func (f *forkbox) describe(ctx context.Context) string {
	where := "daemon at " + f.c.BaseURL()
	switch {
	case f.d != nil && f.removeDir:
		where = "private in-process daemon on a temporary data dir"
	case f.d != nil:
		where = "private in-process daemon, data dir " + f.dataDir
	}
	info, err := f.c.Info(ctx)
	if err != nil {
		return where
	}
	return fmt.Sprintf("%s, driver %s, %s", info.Version, info.DefaultDriver, where)
}

// create creates a session with the daemon's defaults and returns its id
// and how long POST /v1/sessions took (the session's agent has answered
// when it returns).
func (f *forkbox) create(ctx context.Context) (string, time.Duration, error) {
	s, d, err := f.createWith(ctx, client.CreateRequest{})
	if err != nil {
		return "", 0, err
	}
	return s.ID, d, nil
}

// createWith creates a session for req, labelled with the run's id, and
// returns it and how long POST /v1/sessions took.
func (f *forkbox) createWith(ctx context.Context, req client.CreateRequest) (*client.Session, time.Duration, error) {
	req.Metadata = f.labels()
	var s *client.Session
	d, err := timed(func() (err error) {
		s, _, err = f.c.CreateSession(ctx, req, "")
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("create: %w", err)
	}
	f.track(s.ID)
	return s, d, nil
}

// labels returns the metadata put on every session the run creates.
func (f *forkbox) labels() map[string]string { return map[string]string{benchLabel: f.runID} }

// exec runs `true` in session id and returns how long the round trip took.
func (f *forkbox) exec(ctx context.Context, id string) (time.Duration, error) {
	var out *client.ExecOutput
	d, err := timed(func() (err error) {
		out, err = f.c.ExecCollect(ctx, id, client.ExecRequest{Argv: []string{"true"}})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("exec true in %s: %w", id, err)
	}
	if out.ExitCode != 0 {
		return 0, fmt.Errorf("exec true in %s: exit code %d (stderr %q)", id, out.ExitCode, out.Stderr)
	}
	return d, nil
}

// runTrue creates a session, runs true in it and destroys it: one cycle
// of the run and sustained rows.
func (f *forkbox) runTrue(ctx context.Context) error {
	id, _, err := f.create(ctx)
	if err != nil {
		return err
	}
	if _, err := f.exec(ctx, id); err != nil {
		return err
	}
	_, err = f.destroy(ctx, id)
	return err
}

// destroy deletes session id and returns how long DELETE took.
func (f *forkbox) destroy(ctx context.Context, id string) (time.Duration, error) {
	d, err := timed(func() error { return f.c.DeleteSession(ctx, id) })
	if err != nil {
		return 0, fmt.Errorf("destroy %s: %w", id, err)
	}
	f.mu.Lock()
	delete(f.live, id)
	f.mu.Unlock()
	return d, nil
}

// untrack forgets session id (destroyed through another client).
func (f *forkbox) untrack(id string) {
	f.mu.Lock()
	delete(f.live, id)
	f.mu.Unlock()
}

// track records session id as alive (close destroys it if nothing else
// does).
func (f *forkbox) track(id string) {
	f.mu.Lock()
	f.live[id] = true
	f.mu.Unlock()
}

// destroyAll destroys sessions ids, at most closeParallel at a time, and
// returns the errors (a session already gone is not one).
func (f *forkbox) destroyAll(ctx context.Context, ids []string) error {
	errs := make([]error, len(ids))
	sem := make(chan struct{}, closeParallel)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := f.destroy(ctx, id); err != nil && !client.IsNotFound(err) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// close puts the base warm pool back as it was, destroys the sessions
// still alive, deletes the snapshots left and, for a private daemon,
// waits for the warm-pool members it tears down in the background, shuts
// it down and removes the temporary data directory (unmounting the
// storage volume the daemon leaves mounted for its next start). It runs within
// cleanupTimeout (plus perSessionCleanup per session left) even when ctx
// is cancelled.
func (f *forkbox) close(ctx context.Context) error {
	f.mu.Lock()
	timeout := cleanupTimeout + time.Duration(len(f.live))*perSessionCleanup
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	var errs []error
	if err := f.restorePools(ctx); err != nil {
		errs = append(errs, err)
	}
	f.mu.Lock()
	ids := slices.Collect(maps.Keys(f.live))
	snaps := slices.Collect(maps.Keys(f.snaps))
	f.mu.Unlock()
	if err := f.destroyAll(ctx, ids); err != nil {
		errs = append(errs, err)
	}
	for _, id := range snaps { // force: also any session started from it
		if err := f.deleteSnapshot(ctx, id, true); err != nil && !client.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if f.d == nil {
		return errors.Join(errs...)
	}
	if err := f.d.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("stop the private daemon: %w", err))
	}
	f.d = nil
	// After the shutdown: the daemon's spares live until it stops.
	if err := waitSandboxesGone(ctx, f.dataDir); err != nil {
		errs = append(errs, err)
	}
	if f.removeDir {
		if len(errs) > 0 {
			// A sandbox may still run from it; leave it for inspection.
			errs = append(errs, fmt.Errorf("kept the data directory %s", f.dataDir))
		} else if err := unmountStorage(f.dataDir); err != nil {
			errs = append(errs, err)
		} else if err := removeTree(f.dataDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// waitSandboxesGone waits until the stopped private daemon's data
// directory holds no sandbox (its Shutdown with StopSessions tore every
// one down: sessions, pool members and spares).
func waitSandboxesGone(ctx context.Context, dataDir string) error {
	dir := filepath.Join(dataDir, "sandboxes")
	for {
		entries, err := os.ReadDir(dir)
		if err != nil || len(entries) == 0 {
			return nil // nothing left (or never made)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d sandbox(es) still in %s: %w", len(entries), dir, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
