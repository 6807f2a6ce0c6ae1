// Package daemon is forkbox serve's composition root: it prepares the data
// directory, opens the store, installs the agent binary, picks the isolation
// driver, builds the template catalog and the sandbox manager, reconciles
// state left by a previous run and serves the API. cmd/ only calls Start.
package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/hostpath"
	"github.com/forkbox/forkbox/internal/inflight"
	"github.com/forkbox/forkbox/metrics"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage/layercache"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/userns"

	"github.com/forkbox/forkbox/api"
	"github.com/forkbox/forkbox/host"
	"github.com/forkbox/forkbox/runtime/runc"
	"github.com/forkbox/forkbox/runtime/runsc"
	"github.com/forkbox/forkbox/sandbox"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/template"
	"github.com/forkbox/forkbox/volume"
)

// Options configure the daemon. Zero values take package defaults' values.
type Options struct {
	// DataDir holds all state (see datadir.Layout).
	DataDir string
	// Listen is the TCP address of the API ("127.0.0.1:0" picks a port).
	Listen string
	// Domain, when set, routes requests for host names "PORT-ID.Domain"
	// to port PORT of sandbox ID (wildcard DNS *.Domain pointed at the
	// daemon) and is the "domain" of E2B's sandbox answers, so the SDKs'
	// getHost(port) names such a host. "": ports by E2B's headers and the
	// REST path only.
	Domain string
	// AgentPath is the forkbox-agent binary to install; "" looks beside
	// the running executable, then in PATH.
	AgentPath string
	// RuncPath is the runc binary; "" looks in PATH.
	RuncPath string
	// RunscPath is gVisor's runsc binary; "" is the pinned build the
	// install script makes (runsc.PinnedBinary) when there, else runsc in
	// PATH. Without one the gvisor driver is not offered.
	RunscPath string
	// GVisorRestore is how gVisor restores read a checkpoint
	// (runsc.Options.Restore; "" reads a checkpoint on a disk with
	// O_DIRECT where runsc can, one in tmpfs through the page cache).
	GVisorRestore string
	// LayerCacheBytes bounds, in bytes, the layers of pulled images that
	// the layer cache keeps although no template uses them (least
	// recently used go first; layers templates use are always kept); 0:
	// defaults.LayerCacheBytes.
	LayerCacheBytes int64
	// PrivateRegistries are registries (host or host:port) at private
	// addresses that tenants' pulls may reach (admins' reach any):
	// template.RegistryPolicy.PrivateRegistries.
	PrivateRegistries []string
	// BrokerUpstreamCA is a PEM file of CA certificates the credential
	// broker trusts for upstream servers besides the system's roots (for
	// private upstreams with their own CA); "" trusts the system's only.
	BrokerUpstreamCA string
	// MemoryImageCacheMB bounds, in MiB, the decrypted memory checkpoints
	// kept (in tmpfs) for later restores of the same snapshots; 0 keeps
	// none: plaintext then exists only while a restore runs.
	MemoryImageCacheMB int
	// Isolation is the driver of sessions that name none: "runc" (the
	// default) or "gvisor".
	Isolation string
	// Limits bound create requests; zero means defaults.Limits().
	Limits node.Limits
	// Storage picks the storage driver: "btrfs", "overlay", or "" for btrfs
	// where it works and overlay otherwise.
	Storage string
	// StorageImageBytes sizes, in bytes, the loop-mounted image a storage
	// driver creates (its blocks reserved on the host) when the data
	// directory's filesystem cannot serve it; 0 applies the one default,
	// storage.DefaultImageBytes (half the free space there, at least 1 GiB,
	// at most storage.MaxImageBytes). An existing image keeps its size.
	StorageImageBytes int64
	// MaxSnapshotEntries bounds the entries (files, directories, links) a
	// snapshot may hold; a snapshot past it is refused with 429
	// resource-exhausted naming the bound. 0 means
	// defaults.MaxSnapshotEntries.
	MaxSnapshotEntries int64
	// Pools are warm pools to set at start-up (they are also kept in the
	// database and can be changed through the API).
	Pools []node.Pool
	// Spares is how many spare sandboxes to keep ready: started sandboxes
	// without files that a create or fork from any template or snapshot
	// (runc tier, no network) takes in milliseconds. 0: none (`forkbox
	// serve` keeps defaults.Spares).
	Spares int
	// EgressResolver resolves the names sandboxes with a network ask for;
	// nil is the host's resolver. (Tests map names to their test hosts.)
	EgressResolver netpolicy.Resolver
	// EgressTestNetworks are documentation-range prefixes sandboxes may
	// reach although they are always blocked otherwise (tests' hosts live
	// in 198.51.100.0/24); see netpolicy.ServiceOptions.TestNetworks.
	EgressTestNetworks []netip.Prefix
	// Capacity bounds the sessions this host runs at once; zero fields
	// take DefaultCapacity's.
	Capacity admission.Capacity
	// Abuse tunes the abuse detector (zero: abuse.DefaultConfig).
	Abuse abuse.Config
	// ExecInflight bounds the exec request bytes in flight, per tenant and
	// in all (zero fields: inflight's defaults, 256 MiB and 1 GiB).
	ExecInflight inflight.Limits
	// AgentReadyTimeout is how long a create waits for a runc sandbox's
	// agent on an idle host (sandbox.Options.AgentReadyTimeout; zero:
	// defaults.AgentReadyTimeout).
	AgentReadyTimeout time.Duration
	// StopSessions makes Shutdown destroy every session and warm-pool
	// member and leave nothing on the host (storage unmounted, its nftables
	// table and cgroup parent removed), as forkbox down does, instead of
	// leaving them for the next daemon to adopt.
	StopSessions bool
	// HostNames overrides the host-wide names derived from the data
	// directory (datadir.Layout.HostNames); nil keeps them. Tests use
	// datadir.LegacyHostNames to stand in for a previous version.
	HostNames *datadir.HostNames
	// WrapNode, when set, is given the host's Node and returns the Node
	// the API serves (it must forward to the one it got). Tests use it to
	// prove that the API reaches sessions through the node.Node interface
	// alone; a router in front of several Nodes fits the same seam.
	WrapNode func(node.Node) node.Node
	// Fleet places the host in a fleet (zero: one host alone, its
	// embedded NATS listening on no port).
	Fleet FleetOptions
	Log   *slog.Logger
}

// Daemon is a running forkbox serve.
type Daemon struct {
	// Addr is the address the API listens on.
	Addr string
	// URL is the API's base URL ("http://127.0.0.1:7070").
	URL string
	// KeyFile is where the generated API key is stored.
	KeyFile string

	log *slog.Logger
	// layout and names are the data directory's and its host-wide names.
	layout datadir.Layout
	names  datadir.HostNames
	stop   bool     // Options.StopSessions
	lock   *os.File // holds layout.Lock() until Shutdown ends
	// scratch is the tmpfs directory of restores in progress (removed at
	// shutdown: it lives outside the data directory).
	scratch string
	st      *store.Store
	sdrv    storage.Driver
	net     *netpolicy.Service // nil when the host cannot give sandboxes networks
	mgr     *host.Node
	fleet   *fleetHost
	routing *fleetRouting // nil alone
	ften    *fleetTenancy // nil alone
	srv     *http.Server
	served  chan error
	active  sync.WaitGroup // requests being handled
}

// Start prepares everything and starts serving. It returns once the API
// listens. Sandboxes left running by a previous daemon are adopted.
func Start(ctx context.Context, opts Options) (d *Daemon, retErr error) {
	if opts.DataDir == "" {
		opts.DataDir = defaults.DataDir
	}
	if opts.Listen == "" {
		opts.Listen = defaults.Listen
	}
	if opts.Limits.MaxTimeoutS == 0 {
		opts.Limits = defaults.Limits()
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("forkbox serve must run as root (it creates namespaces, cgroups and mounts)")
	}
	execBudget, err := inflight.New(opts.ExecInflight, node.ExecOverhead+node.MaxExecBody)
	if err != nil {
		return nil, err
	}
	layout, err := datadir.New(opts.DataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(layout.Root, 0o711); err != nil {
		return nil, err
	}
	// One daemon per data directory; a restart may overlap the previous
	// daemon's last moments.
	lock, err := lockDataDir(ctx, layout, 60*time.Second)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			lock.Close()
		}
	}()
	// 0711: sandbox processes run as unprivileged host ids and must be able
	// to traverse to their root filesystem, but not to list anything.
	for _, dir := range []string{layout.Root, layout.Templates(), layout.Sandboxes(), filepath.Dir(layout.AgentBinary())} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
	}
	// Each sandbox's own directory under DATA/sandboxes admits only its
	// ids (sandbox.identity); the storage directory admits the storage ids,
	// which sandboxes on a filesystem that cannot be id-mapped run as.
	dir := layout.StorageRoot()
	if err := os.MkdirAll(dir, 0o710); err != nil {
		return nil, err
	}
	if err := restrictSandboxesDir(dir, storage.DefaultIDShift); err != nil {
		return nil, err
	}
	if err := checkTraversable(layout.Root); err != nil {
		return nil, err
	}
	if err := checkIDRanges(sandboxIDSpans(), "/etc/subuid", "/etc/subgid", "/etc/passwd", "/etc/group"); err != nil {
		return nil, err
	}
	if err := userns.CheckTools(); err != nil {
		return nil, err
	}
	st, err := store.Open(ctx, layout.Database())
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			st.Close()
		}
	}()
	if err := ensureAPIKey(ctx, st, layout.APIKey(), log); err != nil {
		return nil, fmt.Errorf("api key: %w", err)
	}
	agentPath, err := installAgent(opts.AgentPath, layout.AgentBinary())
	if err != nil {
		return nil, fmt.Errorf("install forkbox-agent: %w", err)
	}
	snapKey, err := seal.LoadKey(layout.SnapshotKey())
	if err != nil {
		return nil, fmt.Errorf("snapshot key: %w", err)
	}
	// Checkpoints in the clear that a previous run did not finish with
	// are process memory: remove them.
	for _, dir := range []string{layout.Scratch(), layout.CheckpointScratch()} {
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
	}
	// Made again at once, the daemon's own: its name in /dev/shm is one
	// anyone can compute and make first.
	if err := datadir.EnsurePrivateDir(layout.Scratch()); err != nil {
		return nil, fmt.Errorf("scratch directory: %w", err)
	}
	names := layout.HostNames()
	if opts.HostNames != nil {
		names = *opts.HostNames
	}
	drivers, err := openDrivers(opts, layout, names, log)
	if err != nil {
		return nil, err
	}
	sdrv, err := openStorage(ctx, layout, opts, log)
	if err != nil {
		return nil, err
	}
	// Sandboxes that ask for a network get one through the egress
	// service; without it (no nftables, say) such creates are refused and
	// every other sandbox works as before.
	netsvc, err := netpolicy.NewService(netpolicy.ServiceOptions{
		Dir: layout.Netns(), Resolver: opts.EgressResolver, TestNetworks: opts.EgressTestNetworks, Log: log,
		Table: names.NftTable, LinkGroup: names.LinkGroup})
	if err != nil {
		log.Warn("egress service unavailable: sandboxes can have no network", "err", err)
		netsvc = nil
	}
	capacity := withDefaultCapacity(opts.Capacity)
	if opts.Limits.OpenFileBytes == 0 {
		opts.Limits.OpenFileBytes = defaults.OpenFileBytes
	}
	fileMax, err := ensureFileMax(fileMaxPath, neededFileMax(capacity, hostMemoryBytes(), opts.Limits.OpenFileBytes), log)
	if err != nil {
		return nil, err
	}
	opts.Limits.HostFileMax = fileMax
	ids, err := openIDs(layout)
	if err != nil {
		return nil, err
	}
	fh, err := startFleet(ctx, opts.Fleet, layout, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			fh.close()
		}
	}()
	rec := audit.New(st, log)
	ften := newFleetTenancy(fh, st, log) // nil alone
	ms := metrics.New()
	secrets, err := openSecrets(st, snapKey, netsvc, rec, opts.BrokerUpstreamCA, log)
	if err != nil {
		return nil, err
	}
	vols := volume.New(st, sdrv, storage.DefaultIDShift, layout.Volumes())
	mgr := host.New(sandbox.Options{
		Layout: layout, Store: st, Drivers: drivers, SnapshotKey: snapKey, MemoryImageCacheBytes: int64(opts.MemoryImageCacheMB) << 20, DefaultDriver: opts.Isolation, Storage: sdrv, AgentPath: agentPath,
		Limits: opts.Limits, Shift: storage.DefaultIDShift, IDs: ids, Net: netsvc, Secrets: secrets, Log: log,
		Capacity: capacity, Audit: rec, Metrics: ms, Abuse: opts.Abuse,
		ExecInflight: execBudget, AgentReadyTimeout: opts.AgentReadyTimeout, Volumes: vols,
		FleetQuota: ften.quota(),
	}, host.Options{Spares: opts.Spares, Replicas: fh.replicas()})
	vols.UseQuota(mgr.ReserveQuota) // max_volumes, copies for sessions included
	ms.SetSource(mgr)
	catalog := template.NewCatalog(layout, st, storage.DefaultIDShift, mgr.RemoveTemplateIfUnused, sdrv)
	catalog.SweepTemp()
	if opts.LayerCacheBytes <= 0 {
		opts.LayerCacheBytes = defaults.LayerCacheBytes
	}
	layers, err := layercache.Open(layout.Layers(), opts.LayerCacheBytes, catalog.LayersInUse)
	if err != nil {
		return nil, err
	}
	catalog.UsePull(layers, template.RegistryPolicy{PrivateRegistries: opts.PrivateRegistries})
	unavailable, err := catalog.Register(ctx)
	if err != nil {
		return nil, fmt.Errorf("register templates with %s storage: %w", sdrv.Name(), err)
	}
	for _, name := range unavailable {
		log.Warn("template unavailable: its only copy was in a storage volume this daemon does not have; delete and import it again",
			"template", name, "storage", sdrv.Name())
	}
	if err := mgr.Recover(ctx); err != nil {
		return nil, fmt.Errorf("recover sandboxes: %w", err)
	}
	// Adopted sandboxes of a previous version now have this daemon's
	// link group; the table that version shared goes once no link of
	// any daemon of that version is left on the host.
	if netsvc != nil && names.NftTable != netpolicy.LegacyHostTable {
		if gone, err := netpolicy.RetireLegacyHostTable(); err != nil {
			log.Warn("remove the previous version's shared nftables table", "err", err)
		} else if gone {
			log.Debug("the previous version's shared nftables table is gone")
		}
	}
	if mgr.TemplateReferenced(ctx, storage.BaseTemplate) && !storage.BaseIsCurrent(layout.Template(storage.BaseTemplate)) {
		log.Warn("base template is outdated but sessions or snapshots use it; it is rebuilt on a restart when none do")
	} else if err := catalog.EnsureBase(ctx); err != nil {
		mgr.Close()
		return nil, err
	}
	for _, p := range opts.Pools {
		if _, err := mgr.SetPool(ctx, p); err != nil {
			mgr.Close()
			return nil, fmt.Errorf("pool %s: %w", p.Template, err)
		}
	}

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		mgr.Close()
		return nil, err
	}
	// No answer names the data directory or the decrypted checkpoints.
	hide := hostpath.New(layout.Root, layout.Scratch())
	var served node.Node = mgr
	if opts.WrapNode != nil {
		served = opts.WrapNode(mgr)
	}
	routing := fh.routing(served, opts.Fleet, log)
	if routing != nil {
		served = routing.tracked
	}
	apiServer := api.New(served, st, catalog, layout.Templates(), rec, ms, hide, log)
	apiServer.SetDomain(opts.Domain)
	apiServer.SetSecrets(secrets)
	apiServer.SetHosts(fh)
	apiServer.SetEnded(fh.ended)
	apiServer.SetAuditReader(ften.auditReader())
	if netsvc != nil {
		apiServer.SetFetcher(netsvc.Fetcher(nil))
	}
	d = &Daemon{
		Addr: ln.Addr().String(), URL: "http://" + ln.Addr().String(), KeyFile: layout.APIKey(),
		log: log, st: st, sdrv: sdrv, net: netsvc, mgr: mgr, fleet: fh, ften: ften, served: make(chan error, 1), scratch: layout.Scratch(),
		layout: layout, names: names, stop: opts.StopSessions, lock: lock, routing: routing,
	}
	apiURL := opts.Fleet.APIURL
	if apiURL == "" {
		apiURL = d.URL
	}
	fh.destroy = mgr.Destroy
	if err := fh.heartbeat(ctx, opts.Fleet, hostRecord(fh.Self(), apiURL, mgr, catalog, capacity)); err != nil {
		ln.Close()
		mgr.Close()
		return nil, err
	}
	var front http.Handler = apiServer
	if routing != nil {
		front = routing.handler(fh, opts.Fleet, apiServer, st, opts.Domain, log)
		apiServer.SetMigrator(routing.migrate)
	}
	ften.start(mgr)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.active.Add(1)
		defer d.active.Done()
		front.ServeHTTP(w, r)
	})
	d.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second}
	go func() { d.served <- d.srv.Serve(ln) }()
	log.Info("forkbox serving", "url", d.URL, "data_dir", layout.Root, "drivers", len(drivers), "isolation", mgr.DefaultDriver().Name(),
		"storage", sdrv.Name(), "api_key_file", d.KeyFile, "fleet_node", fh.Self(), "fleet_replicas", fh.f.Replicas())
	return d, nil
}

// Wait blocks until the server stops and returns why.
func (d *Daemon) Wait() error {
	err := <-d.served
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting requests, waits up to ctx for running ones, and
// closes the manager and the store. Sandboxes keep running; the next Start
// adopts them. With Options.StopSessions it destroys them first (each
// teardown bounded, a few minutes in all) and then releases the host as
// forkbox down does (Down).
//
// Requests still running when ctx ends (exec streams, transfers) are cut
// then: their clients see the connection close, and a foreground command
// is killed as when its client goes away, instead of running on unseen
// until its own timeout.
func (d *Daemon) Shutdown(ctx context.Context) error {
	// The egress listeners go first: a next daemon may start as soon as
	// the API port is free and must be able to take them over.
	if d.net != nil {
		d.net.Close()
	}
	if err := d.srv.Shutdown(ctx); err != nil {
		d.log.Warn("shutdown: cutting requests still running", "err", err)
		_ = d.srv.Close()
		done := make(chan struct{})
		go func() { d.active.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			d.log.Warn("shutdown: requests still running after they were cut")
		}
	}
	d.fleet.stopDestroys() // no reconcile reaches the node from here on
	var stopErr error
	if d.stop {
		if stopErr = d.mgr.StopAll(context.WithoutCancel(ctx), "the daemon stopped with --stop-sessions"); stopErr != nil {
			d.log.Error("stop sessions", "err", stopErr)
		}
	}
	// The node first: it waits for the snapshots' copies to the fleet.
	d.routing.close()
	d.mgr.Close()
	d.ften.close()
	d.fleet.close()
	if err := runsc.ReleaseRoot(d.layout.RunscRoot()); err != nil {
		d.log.Warn("release the gVisor state directory", "err", err)
	}
	_ = os.RemoveAll(d.scratch)
	if err := d.sdrv.Close(); err != nil {
		d.log.Warn("close storage", "err", err)
	}
	err := d.st.Close()
	if d.stop && stopErr == nil {
		_, stopErr = releaseHost(d.layout, d.names, d.log)
	}
	d.lock.Close()
	return errors.Join(stopErr, err)
}

// SnapshotObjects returns the fleet's snapshot object store (for tests
// and benchmarks in-process); nil until it is open (a cluster without
// quorum yet).
func (d *Daemon) SnapshotObjects() fleet.Objects {
	if o := d.fleet.objects.Load(); o != nil {
		return o
	}
	return nil
}

// Manager returns this host's node: the sandbox manager with the concerns
// composed around it (for tests and benchmarks in-process).
func (d *Daemon) Manager() *host.Node { return d.mgr }

// ensureAPIKey makes sure an API key file exists and its key is accepted.
// On first start it generates "e2b_" + 40 hex digits and writes it (0600):
// the shape E2B SDKs accept (the Python SDK checks ^e2b_[0-9a-f]+$), so the
// one key serves the forkbox API and the E2B API alike.
func ensureAPIKey(ctx context.Context, st *store.Store, path string, log *slog.Logger) error {
	b, err := os.ReadFile(path)
	if err == nil {
		key := strings.TrimSpace(string(b))
		if _, aerr := st.AuthenticateKey(ctx, key); aerr == nil {
			return nil
		}
		if key != "" {
			k := installKey(key)
			if prev, err := st.GetAPIKey(ctx, k.ID); err == nil && !prev.RevokedAt.IsZero() {
				// Revoked on purpose (another admin key took over): it
				// stays revoked, and the daemon serves the other keys.
				log.Warn("the API key in the key file is revoked; use another admin key", "file", path, "key", k.ID)
				return nil
			}
			return st.AddAPIKey(ctx, k, key)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	raw := make([]byte, 20)
	if _, err := rand.Read(raw); err != nil {
		return err
	}
	key := "e2b_" + hex.EncodeToString(raw)
	if err := st.AddAPIKey(ctx, installKey(key), key); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(key + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	log.Info("generated an API key", "file", path)
	fmt.Fprintf(os.Stderr, "forkbox: generated an API key; it is in %s\n", path)
	return nil
}

// installAgent copies the agent binary to dst (root-owned, 0755) unless an
// identical copy is there, and returns dst. Sandboxes mount dst, so the
// binary they run cannot change under them when the source is rebuilt.
func installAgent(src, dst string) (string, error) {
	if src == "" {
		src = findAgent()
	}
	if src == "" {
		return "", errors.New("forkbox-agent not found beside the forkbox binary or in PATH (build it with `make build`, or pass --agent)")
	}
	want, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	if have, err := os.ReadFile(dst); err == nil && bytes.Equal(have, want) {
		return dst, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".forkbox-agent-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, bytes.NewReader(want)); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return dst, os.Rename(tmp.Name(), dst)
}

func findAgent() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "forkbox-agent")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("forkbox-agent"); err == nil {
		return p
	}
	return ""
}

// openDrivers returns the isolation drivers this host has: runc, which
// must work, and gVisor when runsc is installed. Isolation must name one
// of them.
func openDrivers(opts Options, layout datadir.Layout, names datadir.HostNames, log *slog.Logger) ([]runtime.Driver, error) {
	rc, err := runc.New(runc.Options{Binary: opts.RuncPath, StateRoot: layout.RuncRoot(), CgroupParent: names.CgroupParent})
	if err != nil {
		return nil, err
	}
	drivers := []runtime.Driver{rc}
	gv, err := runsc.New(runsc.Options{Binary: opts.RunscPath, StateRoot: layout.RunscRoot(), CgroupParent: names.CgroupParent,
		Restore: opts.GVisorRestore})
	switch {
	case err == nil:
		flags, direct := gv.RestoreArgs()
		log.Info("gVisor isolation", "runsc", gv.Binary(), "version", gv.Version(), "restore_flags", flags,
			"direct_from_disk", direct)
		drivers = append(drivers, gv)
	case opts.Isolation == runsc.DriverName || opts.RunscPath != "" || errors.Is(err, errdefs.ErrInvalidArgument):
		return nil, err
	default:
		log.Info("gVisor isolation unavailable (install runsc from bookworm-backports)", "err", err)
	}
	if opts.Isolation != "" {
		found := false
		for _, d := range drivers {
			found = found || d.Name() == opts.Isolation
		}
		if !found {
			return nil, fmt.Errorf("isolation %q: %w: this host has no such driver", opts.Isolation, errdefs.ErrInvalidArgument)
		}
	}
	return drivers, nil
}

// installKey is the record of the install's own key (secret key): the
// default tenant's, and an admin key.
func installKey(secret string) store.APIKey {
	return store.APIKey{ID: "default-" + secret[max(0, len(secret)-6):], Name: "default", Tenant: store.DefaultTenant, Admin: true}
}

// DefaultCapacity is this host's: at most 1000 sessions, whose memory
// limits add up to at most four times the host's memory (limits are
// ceilings; most sandboxes use a fraction of theirs).
func DefaultCapacity() admission.Capacity {
	c := admission.Capacity{MaxSessions: 1000}
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err == nil {
		c.MaxMemoryMB = int64(si.Totalram) * int64(si.Unit) >> 20 * 4
	}
	return c
}

func withDefaultCapacity(c admission.Capacity) admission.Capacity {
	d := DefaultCapacity()
	if c.MaxSessions == 0 {
		c.MaxSessions = d.MaxSessions
	}
	if c.MaxMemoryMB == 0 {
		c.MaxMemoryMB = d.MaxMemoryMB
	}
	return c
}

// StorageDriver names the storage driver the daemon runs on ("btrfs" or
// "overlay").
func (d *Daemon) StorageDriver() string { return d.sdrv.Name() }

// openIDs opens the host-wide claims of host id slices for the sandboxes
// of layout's data directory. Their owner is the directory's real path:
// the same directory reached another way after a restart keeps its
// claims.
func openIDs(layout datadir.Layout) (*userns.Claims, error) {
	owner, err := filepath.EvalSymlinks(layout.Root)
	if err != nil {
		return nil, err
	}
	return userns.OpenClaims(userns.DefaultClaimsDir, userns.DefaultRange, owner)
}
