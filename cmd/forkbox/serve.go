package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/inflight"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

func newServeCmd() *cobra.Command {
	var opts daemon.Options
	var level string
	var pools []string
	var imageSize int64
	var execMB, execTenantMB int64
	var layerCacheMB int64
	var peers, secretFile string
	var defaultDiskMB int64
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the forkbox daemon (as root)",
		Long: `Run the forkbox daemon. On first start it creates the data directory, a SQLite
database, the built-in "base" template and an API key (written to DIR/api-key,
mode 0600): the admin key of the "default" tenant, which also creates other
tenants and their keys (forkbox tenant, forkbox key). Sandboxes keep running
across daemon restarts and are adopted; with --stop-sessions the daemon
destroys them when it stops and leaves nothing on the host (see forkbox down).

Fleet: alone, the daemon embeds a NATS server with JetStream that
listens on no port (the host registry lives there; forkbox hosts lists it).
With --cluster, --node-id, --peers, --fleet-listen and --fleet-secret-file on
each of three hosts, their embedded servers form one JetStream cluster
(routes authenticated with the shared secret) and every host's registry lists
all three; --nats URL uses an existing NATS instead (with --fleet-secret-file
for routing). Any host's API then serves every session of the fleet: calls
for another host's sessions are forwarded there (the caller's key checked
here, carried in a request signed with a key derived from the fleet secret),
creates are placed on the best-fitting host, and lists answer the fleet's.`,
		Example: `  forkbox serve
  forkbox serve --cluster prod --node-id a --fleet-listen 10.0.0.1:7422 \
      --peers b=10.0.0.2:7422,c=10.0.0.3:7422 --fleet-secret-file /etc/forkbox/fleet.secret`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := stderrLogger(cmd.ErrOrStderr(), level)
			if err != nil {
				return err
			}
			opts.Log = log
			opts.StorageImageBytes = imageSize << 30
			if layerCacheMB < 1 {
				return fmt.Errorf("--layer-cache-mb %d: must be at least 1", layerCacheMB)
			}
			opts.LayerCacheBytes = layerCacheMB << 20
			opts.ExecInflight = inflight.Limits{Total: execMB << 20, PerTenant: execTenantMB << 20}
			opts.Limits = defaults.Limits()
			if defaultDiskMB < opts.Limits.MinDiskMB || defaultDiskMB > opts.Limits.MaxDiskMB {
				return fmt.Errorf("--default-disk-mb %d: must be between %d and %d", defaultDiskMB, opts.Limits.MinDiskMB, opts.Limits.MaxDiskMB)
			}
			opts.Limits.DefaultDiskMB = defaultDiskMB
			for _, p := range pools {
				name, size, ok := strings.Cut(p, "=")
				n, err := strconv.Atoi(size)
				if !ok || err != nil || name == "" {
					return fmt.Errorf("--pool %q: want TEMPLATE=SIZE", p)
				}
				opts.Pools = append(opts.Pools, node.Pool{Template: name, Size: n})
			}
			if opts.Fleet.NATS.Peers, err = fleet.ParsePeers(peers); err != nil {
				return err
			}
			if u := opts.Fleet.APIURL; u != "" {
				if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
					return fmt.Errorf("--fleet-api %q: want http://HOST:PORT or https://HOST:PORT", u)
				}
			}
			if secretFile != "" {
				if opts.Fleet.NATS.Secret, err = fleet.ReadSecret(secretFile); err != nil {
					return err
				}
			}
			d, err := daemon.Start(cmd.Context(), opts)
			if err != nil {
				return err
			}
			errc := make(chan error, 1)
			go func() { errc <- d.Wait() }()
			select {
			case err := <-errc:
				return err
			case <-cmd.Context().Done():
			}
			if opts.StopSessions {
				fmt.Fprintln(cmd.ErrOrStderr(), "forkbox: stopping; destroying every session (--stop-sessions)")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return d.Shutdown(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.DataDir, "data-dir", defaults.DataDir, "directory for all state")
	f.StringVar(&opts.Listen, "listen", defaults.Listen, "address of the API")
	f.StringVar(&opts.AgentPath, "agent", "", "forkbox-agent binary (default: beside forkbox, then PATH)")
	f.StringVar(&opts.RuncPath, "runc", "", "runc binary (default: from PATH)")
	f.StringVar(&opts.RunscPath, "runsc", "", "gVisor's runsc binary (default: the pinned build make deps installs, else from PATH)")
	f.StringVar(&opts.Domain, "domain", "", "serve sandbox ports at host names PORT-ID.DOMAIN (point wildcard DNS *.DOMAIN at this daemon); E2B's getHost(port) then returns such names")
	f.IntVar(&opts.MemoryImageCacheMB, "memory-image-cache-mb", defaults.MemoryImageCacheMB, "MiB of decrypted memory snapshots kept in tmpfs (plaintext, root-only, each at most 5 minutes unused) for later restores of the same snapshot; 0: none, plaintext exists only while a restore runs")
	f.Int64Var(&layerCacheMB, "layer-cache-mb", defaults.LayerCacheBytes>>20,
		"MiB of pulled images' layers that no template uses kept for later pulls (least recently used go first; layers templates use are always kept)")
	f.StringArrayVar(&opts.PrivateRegistries, "private-registry", nil,
		"a registry (host or host:port) at a private address that tenants' pulls may reach (repeatable; admin keys' pulls reach any address)")
	f.StringVar(&opts.BrokerUpstreamCA, "broker-upstream-ca", "",
		"PEM file of CA certificates the credential broker trusts for upstream servers besides the system's roots (for private upstreams with their own CA)")
	f.StringVar(&opts.GVisorRestore, "gvisor-restore", "", `how gVisor restores read a checkpoint: "plain", "direct", "background" or "direct+background" (default: direct for a checkpoint on a disk where runsc has it, plain from tmpfs)`)
	f.StringVar(&opts.Isolation, "isolation", "runc", `isolation of sessions that ask for none: "runc" or "gvisor"`)
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&opts.Storage, "storage", "", "storage driver: btrfs or overlay (default: btrfs where it works)")
	f.Int64Var(&imageSize, "storage-size", 0, fmt.Sprintf("size in GiB of the storage image (its blocks reserved on the host) made when the data directory's filesystem cannot host the storage driver (default: half the free space there, at least 1, at most %d)", storage.MaxImageBytes>>30))
	f.Int64Var(&opts.MaxSnapshotEntries, "max-snapshot-entries", defaults.MaxSnapshotEntries,
		"most entries (files, directories, links) a snapshot may hold; past it a snapshot gets 429 resource-exhausted")
	f.BoolVar(&opts.StopSessions, "stop-sessions", false,
		"on shutdown destroy every session and release the host (storage unmounted, nftables table and cgroups removed) instead of leaving the sandboxes running for the next daemon")
	f.IntVar(&opts.Spares, "spares", defaults.Spares,
		"spare sandboxes to keep ready: started without files, they let a create or fork from any template or snapshot (runc tier, no network) skip the runtime start (0: none)")
	f.StringArrayVar(&pools, "pool", nil, "keep a warm pool: TEMPLATE=SIZE (repeatable; also settable through the API)")
	f.Int64Var(&defaultDiskMB, "default-disk-mb", defaults.Limits().DefaultDiskMB,
		"disk limit (MiB) of a session that asks for none; under the overlay driver its blocks are reserved on the host's disk at the create")
	f.IntVar(&opts.Capacity.MaxSessions, "max-sessions", 0,
		"most sessions this host runs at once, over all tenants; past it creates get 503 capacity-unavailable (default 1000)")
	f.Int64Var(&opts.Capacity.MaxMemoryMB, "max-memory-mb", 0,
		"most memory (MiB) the sessions' limits may add up to; past it creates get 503 (default: 4x the host's memory)")
	f.Int64Var(&execMB, "max-exec-inflight-mb", defaults.ExecInflightTotal>>20,
		"most exec request bytes (MiB) in flight at once, over all tenants; past it execs get 429 exec-inflight-exceeded")
	f.Int64Var(&execTenantMB, "max-exec-inflight-tenant-mb", defaults.ExecInflightPerTenant>>20,
		"most exec request bytes (MiB) one tenant has in flight at once; past it its execs get 429")
	f.DurationVar(&opts.AgentReadyTimeout, "agent-ready-timeout", defaults.AgentReadyTimeout,
		"how long a create waits for a runc sandbox's agent on an idle host; gVisor waits 3x as long, and both grow "+
			"with the host's load per CPU (at most 90s); past it the create gets 503 sandbox-not-ready")
	f.StringVar(&opts.Fleet.NATS.Cluster, "cluster", "", "name of the JetStream cluster this host's embedded NATS joins (with --node-id, --peers, --fleet-listen, --fleet-secret-file); default: alone")
	f.StringVar(&opts.Fleet.NATS.NodeID, "node-id", "", `this host's id in the fleet (a-z, 0-9, '-'; default "local" alone)`)
	f.StringVar(&peers, "peers", "", "the cluster's other nodes: ID=HOST:PORT,ID=HOST:PORT (their --fleet-listen addresses)")
	f.StringVar(&opts.Fleet.NATS.Listen, "fleet-listen", "", "HOST:PORT the embedded NATS accepts routes from the other nodes on (cluster only)")
	f.StringVar(&secretFile, "fleet-secret-file", "", "file (mode 0600) holding the fleet secret, the same on every node: routes without it are refused (at least 32 bytes, e.g. head -c 32 /dev/urandom | base64)")
	f.StringVar(&opts.Fleet.NATS.URL, "nats", "", "use this existing NATS (with JetStream) instead of an embedded server, e.g. nats://user:pass@host:4222 (needs --node-id)")
	f.IntVar(&opts.Fleet.CacheMB, "snapshot-cache-mb", daemon.DefaultSnapshotCacheMB, "MiB of other hosts' snapshots pulled from the fleet's object store kept on this host (still sealed; least recently used evicted first)")
	f.StringVar(&opts.Fleet.APIURL, "fleet-api", "", "the URL other hosts reach this host's API at, as the host registry lists it (default: http:// and the --listen address)")
	f.DurationVar(&opts.Fleet.LostAfter, "host-lost-after", fleet.DefaultLostAfter, "how long a host's heartbeat (every 2s) may be missing before it is lost: listed lost, its sessions terminated (host-lost), destroyed when it comes back")
	return cmd
}

// stderrLogger returns a text logger to w (the command's standard error)
// at level ("debug", "info", "warn" or "error"); an unknown level is an
// error.
func stderrLogger(w io.Writer, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, err
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lv})), nil
}
