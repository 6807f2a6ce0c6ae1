package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/bench"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/defaults"
)

// newBenchCmd returns `forkbox bench`, a thin wrapper over package bench:
// it maps flags to bench.Options and prints the report.
func newBenchCmd(g *globals) *cobra.Command {
	var opts bench.Options
	var storageGiB int64
	var only string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark forkbox beside the runc and runsc CLIs and podman (as root)",
		Long: `Measure forkbox through its REST API and, in the same run, its peers: the raw
runc CLI and podman on a busybox root filesystem, the runsc (gVisor) CLI, and a
plain copy for snapshots. Wherever forkbox has a peer, the systems alternate
round by round (forkbox, runc, podman, forkbox, ...), and each peer's ratio to
forkbox is the median of the ratios within a round, so that a load spike on a
shared machine hits both of a pair.

Row groups (--only, comma-separated; "default" or "all" too):
  create     cold create (no warm pool) and destroy
  pool       create taking a ready warm-pool member
  run        create + exec true + destroy; runc run, podman run --rm
  exec       exec true; runc exec, podman exec
  pause      pause and resume; runc and podman's
  snapshot   snapshot of a session that wrote --snapshot-mb; podman commit, cp (not in default)
  fork       fork 8 from a files snapshot until every child answers exec; 8 runc containers at once
  fork64     the same with 64 (at most 5 rounds)
  restore    one session from a files snapshot until it answers exec; one runc container
  freeze     snapshot right after an unsynced write and the freeze it causes (not in default)
  sustained  create -> exec -> destroy by --clients at once for --sustain; runc run the same way
  gvisor     gVisor exec, memory snapshot (100 MB resident), restore, fork 5; the runsc CLI
  code       code interpreter: runCode 1+1 warm, the first after create, a chart cell; python3 -c execs
  ports      a small GET and a 100 MiB download from a server in a sandbox; the same server on the host
  egress     a 100 MiB HTTP download through the egress service, runc and gVisor tiers; a host process
  broker     an HTTPS GET with a secret (TLS terminated by the broker) and without one; a host process
  pull       a small image pulled from a local registry, cold and with its layers held; podman pull
  idle       memory and CPU per idle sandbox, --idle-runc and --idle-gvisor held at once
  route      a create placed on another host of a two-daemon fleet and an exec routed to it, beside
             the same calls to that host itself (not in default)
  fleet-sim  --fleet-hosts simulated hosts heartbeating and placing --fleet-rate creates/s around
             --fleet-live sessions on a 3-node JetStream cluster in-process, at each of
             --fleet-scales times that, a registry List per create and a cached view; no daemon,
             minutes (not in default)

Prints p50/p99 in milliseconds per system, the paired ratio, and the targets.

By default forkbox is a private daemon started in-process on a temporary data
directory and removed at the end (--storage picks its storage driver); --url
(or FORKBOX_URL) measures a running daemon instead. Against a running daemon
the benchmark sets the base template's warm pool for a while and puts it back
as it was at the end. Every session, snapshot and peer container it makes is
removed at the end, also after an error or an interrupt.`,
		Example: `  forkbox bench -n 20
  forkbox bench --only fork,exec -n 10
  forkbox bench --only idle --idle-runc 1000 --idle-gvisor 200
  forkbox bench --only all --skip-peers --json
  forkbox bench --only fleet-sim --fleet-scales 1,2,4 --fleet-step 20s
  FORKBOX_URL=http://127.0.0.1:7070 forkbox bench`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			groups, err := bench.ParseGroups(only)
			if err != nil {
				return err
			}
			opts.Only = groups
			if opts.DaemonLog != "" {
				var lv slog.Level
				if err := lv.UnmarshalText([]byte(opts.DaemonLog)); err != nil {
					return fmt.Errorf("--daemon-log: %q is none of debug, info, warn, error", opts.DaemonLog)
				}
			}
			opts.StorageImageBytes = storageGiB << 30
			opts.APIKeyFile = g.keyFile
			opts.Progress = cmd.ErrOrStderr()
			rep, err := bench.Run(cmd.Context(), opts)
			if rep != nil {
				write := rep.WriteTable
				if g.json {
					write = rep.WriteJSON
				}
				if werr := write(cmd.OutOrStdout()); werr != nil {
					return werr
				}
			}
			if err != nil {
				return err
			}
			return rep.ForkboxErr()
		},
	}
	f := cmd.Flags()
	f.IntVarP(&opts.N, "iterations", "n", bench.DefaultN, "measured rounds per operation (after 2 warm-ups)")
	f.StringVar(&only, "only", "default", "row groups to run, comma-separated: default, all, "+strings.Join(bench.Groups, ", "))
	f.IntVar(&opts.SnapshotMB, "snapshot-mb", bench.DefaultSnapshotMB, "MB a session writes before the snapshot and fork rows")
	f.IntVar(&opts.Clients, "clients", bench.DefaultClients, "clients at once in the sustained row")
	f.DurationVar(&opts.Sustain, "sustain", bench.DefaultSustain, "how long the sustained row runs each system")
	f.IntVar(&opts.Spares, "spares", defaults.Spares, "spare sandboxes the private daemon keeps ready (as forkbox serve --spares)")
	f.IntVar(&opts.IdleRunc, "idle-runc", bench.DefaultIdleRunc, "idle runc sessions the idle row holds at once")
	f.IntVar(&opts.IdleGVisor, "idle-gvisor", bench.DefaultIdleGVisor, "idle gVisor sessions the idle row holds at once")
	f.DurationVar(&opts.IdleWindow, "idle-window", bench.DefaultIdleWindow, "how long the idle row measures CPU")
	f.IntVar(&opts.FleetHosts, "fleet-hosts", bench.DefaultFleetHosts, "simulated hosts of the fleet-sim group at scale 1")
	f.Float64Var(&opts.FleetRate, "fleet-rate", bench.DefaultFleetRate, "creates (and destroys) a second of the fleet-sim group at scale 1")
	f.IntVar(&opts.FleetLive, "fleet-live", bench.DefaultFleetLive, "live sessions of the fleet-sim group at scale 1")
	f.Float64SliceVar(&opts.FleetScales, "fleet-scales", bench.DefaultFleetScales, "the fleet-sim group's steps, multiples of its scale-1 fleet")
	f.DurationVar(&opts.FleetStep, "fleet-step", bench.DefaultFleetStep, "how long the fleet-sim group measures each step (after 4 s of warm-up)")
	f.BoolVar(&opts.SkipPeers, "skip-peers", false, "measure forkbox only (not runc, runsc, podman and cp)")
	f.StringVar(&opts.URL, "url", "", "measure the daemon at this URL (default "+client.EnvURL+"; unset: a private daemon)")
	f.StringVar(&opts.APIKey, "api-key", "", "API key of the daemon at --url (default "+client.EnvAPIKey+", then --api-key-file)")
	f.StringVar(&opts.AgentPath, "agent", "", "forkbox-agent binary of the private daemon (default: beside forkbox, then PATH)")
	f.StringVar(&opts.DataDir, "data-dir", "", "data directory of the private daemon, kept afterwards (default: a temporary one)")
	f.StringVar(&opts.Storage, "storage", "", "storage driver of the private daemon: btrfs or overlay (default: btrfs where it works)")
	f.StringVar(&opts.DaemonLog, "daemon-log", "", "log level of the private daemon, written to stderr: debug (each operation's phases with durations), info, warn, error (default warn)")
	f.Int64Var(&storageGiB, "storage-size", 0, "size in GiB of the private daemon's storage image (default: half the free disk, at most 64)")
	return cmd
}
