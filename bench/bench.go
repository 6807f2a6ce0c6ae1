// Package bench is `forkbox bench`: it measures forkbox (through its REST
// API, against a private in-process daemon or a running one) and, in the
// same run and on the same machine, its peers: the raw runc CLI and podman
// with runc, both on a busybox root filesystem, the runsc (gVisor) CLI,
// and for snapshots a plain copy of as much data as reference. It reports
// nearest-rank p50/p99 and means in milliseconds, each peer's paired ratio
// to forkbox, the idle memory and CPU of many sandboxes held at once, and
// whether forkbox meets its targets.
//
// Every operation runs Warmup uncounted rounds, then N measured rounds.
// Where forkbox has a peer, each round runs forkbox and every peer once,
// back to back (interleave.go), so that a machine whose load moves slows
// all of one round alike; the ratio to forkbox is taken round by round.
// Options.Only picks the row groups (groups.go). Everything the benchmark
// creates (sessions, snapshots, warm-pool settings, containers, images,
// cgroups, temporary directories, the private daemon and its storage
// mount) is removed or put back before Run returns, also when it fails or
// ctx is cancelled.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Defaults for Options.
const (
	// DefaultN is the number of measured rounds per operation (some rows
	// cap it: fork64MaxN, gvisorMaxN, gvisorForkMaxN).
	DefaultN = 10
	// DefaultWarmup is the number of uncounted iterations before them.
	DefaultWarmup = 2
	// DefaultSnapshotMB is how many MB (10^6 bytes) a sandbox writes before
	// it is snapshotted (DESIGN.md's "500 MB written").
	DefaultSnapshotMB = 500
)

// cleanupTimeout bounds the teardown of everything a run created; teardown
// runs even after ctx is cancelled.
const cleanupTimeout = 60 * time.Second

// Options configure Run. Zero values take the defaults.
type Options struct {
	// N is the number of measured iterations per operation (DefaultN when 0).
	N int
	// Warmup is the number of uncounted iterations run first (DefaultWarmup
	// when 0).
	Warmup int
	// SkipPeers measures forkbox only (no runc, podman or plain copy).
	SkipPeers bool
	// SnapshotMB is how many MB (10^6 bytes) of random data a sandbox
	// writes before the snapshot and fork rows (DefaultSnapshotMB when 0);
	// the podman commit and plain copy references use as much.
	SnapshotMB int
	// UnsyncedMB is how many MB (10^6 bytes) a sandbox writes without
	// sync before the unsynced-snapshot rows (DefaultUnsyncedMB when 0).
	UnsyncedMB int

	// Only lists the row groups to run (Groups; ParseGroups reads a
	// flag); empty runs DefaultGroups.
	Only []string
	// Clients is how many clients the sustained row runs at once
	// (DefaultClients when 0).
	Clients int
	// Sustain is how long the sustained row runs each system
	// (DefaultSustain when 0).
	Sustain time.Duration
	// Spares is how many spare sandboxes the private daemon keeps
	// (daemon.Options.Spares; forkbox serve's default is defaults.Spares).
	Spares int
	// IdleRunc and IdleGVisor are how many idle sessions of each tier the
	// idle rows hold at once (DefaultIdleRunc, DefaultIdleGVisor when 0).
	IdleRunc, IdleGVisor int
	// IdleWindow is how long the idle rows measure CPU (DefaultIdleWindow
	// when 0).
	IdleWindow time.Duration
	// FleetHosts, FleetRate (creates a second) and FleetLive (sessions)
	// are the fleet simulation's fleet at scale 1 (DefaultFleetHosts,
	// DefaultFleetRate, DefaultFleetLive when 0); FleetScales are its
	// steps' multiples of it (DefaultFleetScales when empty) and
	// FleetStep how long each is measured (DefaultFleetStep when 0).
	FleetHosts  int
	FleetRate   float64
	FleetLive   int
	FleetScales []float64
	FleetStep   time.Duration

	// URL is the base URL of a running daemon to measure; "" reads
	// FORKBOX_URL, and when that is empty too Run starts a private daemon.
	URL string
	// APIKey authenticates to the daemon at URL; "" reads FORKBOX_API_KEY,
	// then APIKeyFile when URL is on this host.
	APIKey string
	// APIKeyFile is read for a local daemon's key when APIKey and
	// FORKBOX_API_KEY are empty ("" means defaults.KeyFile).
	APIKeyFile string

	// AgentPath is the forkbox-agent binary of the private daemon; "" looks
	// beside the running executable, then in PATH.
	AgentPath string
	// ForkboxPath is the forkbox binary the replicate rows start their
	// hosts from (each its own `forkbox serve` process); "" means the
	// running executable, which is forkbox itself under `forkbox bench`.
	ForkboxPath string
	// DataDir is the private daemon's data directory. "" makes a temporary
	// one that is removed at the end; a given directory is created (0711)
	// when missing and kept, so a later run reuses its base template.
	DataDir string
	// Storage is the private daemon's storage driver: "btrfs", "overlay",
	// or "" for the daemon's choice (btrfs where it works).
	Storage string
	// StorageImageBytes sizes the private daemon's storage image (reserved
	// on the host; 0 = the driver's default).
	StorageImageBytes int64

	// Progress receives one line per phase and the daemon's warnings; nil
	// discards them.
	Progress io.Writer
	// DaemonLog is the private daemon's log level written to Progress:
	// "debug", "info", "warn" (the default when "") or "error". Debug
	// shows each operation's phases with their durations.
	DaemonLog string
}

// withDefaults returns o with zero values replaced by the defaults.
func (o Options) withDefaults() Options {
	positive(&o.N, DefaultN)
	positive(&o.Warmup, DefaultWarmup)
	positive(&o.SnapshotMB, DefaultSnapshotMB)
	positive(&o.UnsyncedMB, DefaultUnsyncedMB)
	positive(&o.Clients, DefaultClients)
	positive(&o.Sustain, DefaultSustain)
	positive(&o.IdleRunc, DefaultIdleRunc)
	positive(&o.IdleGVisor, DefaultIdleGVisor)
	positive(&o.IdleWindow, DefaultIdleWindow)
	positive(&o.FleetHosts, DefaultFleetHosts)
	positive(&o.FleetRate, DefaultFleetRate)
	positive(&o.FleetLive, DefaultFleetLive)
	positive(&o.FleetStep, DefaultFleetStep)
	if len(o.Only) == 0 {
		o.Only = DefaultGroups
	}
	if len(o.FleetScales) == 0 {
		o.FleetScales = DefaultFleetScales
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// positive sets *v to d when *v is zero or negative (an option not
// given).
func positive[T int | float64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// progressf writes one progress line.
func (o Options) progressf(format string, args ...any) {
	fmt.Fprintf(o.Progress, "bench: "+format+"\n", args...)
}

// logger returns the private daemon's logger, to Progress: warnings and
// errors only unless DaemonLog names a lower level (an unknown name is
// warn; the flag is checked where it is read).
func (o Options) logger() *slog.Logger {
	lv := slog.LevelWarn
	if o.DaemonLog != "" {
		if err := lv.UnmarshalText([]byte(o.DaemonLog)); err != nil {
			lv = slog.LevelWarn
		}
	}
	return slog.New(slog.NewTextHandler(o.Progress, &slog.HandlerOptions{Level: lv}))
}

// Run measures the row groups of opts.Only on forkbox and, unless
// SkipPeers, beside it on its peers, and returns the report. An operation
// that fails is reported in its row (Result.Error) and the rest still run;
// Report.ForkboxErr tells whether forkbox's rows all succeeded. Run itself
// fails only when forkbox cannot be reached (the private daemon does not
// start), when a group name is unknown, when ctx is cancelled, or when
// cleaning up fails.
func Run(ctx context.Context, opts Options) (rep *Report, retErr error) {
	opts = opts.withDefaults()
	for _, g := range opts.Only {
		if !slices.Contains(Groups, g) {
			return nil, fmt.Errorf("unknown row group %q", g)
		}
	}
	rep = &Report{N: opts.N, Warmup: opts.Warmup, Started: time.Now().UTC(), Versions: map[string]string{},
		Groups: opts.Only}

	// Groups that need neither a daemon nor peers (the fleet
	// simulation) run without them.
	var fb *forkbox
	if slices.ContainsFunc(opts.Only, func(g string) bool { return !slices.Contains(standalone, g) }) {
		var err error
		if fb, err = openForkbox(ctx, opts); err != nil {
			return nil, err
		}
	}
	e := &env{opts: opts, fb: fb}
	if !opts.SkipPeers && fb != nil {
		e.p = openPeers(opts, rep.Versions)
	}
	if fb != nil {
		rep.Versions[SystemForkbox] = fb.describe(ctx)
	} else {
		rep.Versions[SystemForkbox] = "no daemon (" + strings.Join(opts.Only, ", ") + " only)"
	}
	for _, g := range opts.Only {
		if ctx.Err() != nil {
			break
		}
		rep.Results = append(rep.Results, e.group(ctx, g)...)
	}
	rep.Idle = e.idle
	if fb != nil {
		rep.Storage = fb.storage
		if err := fb.close(context.WithoutCancel(ctx)); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("clean up forkbox: %w", err))
		}
	}
	if err := e.p.close(context.WithoutCancel(ctx)); err != nil {
		retErr = errors.Join(retErr, fmt.Errorf("clean up peers: %w", err))
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("bench interrupted: %w", err), retErr)
	}
	rep.finish()
	return rep, retErr
}

// series runs op warmup times without counting, then n times, and returns
// the n measured durations. op returns the duration of the part it times
// (it may do untimed setup or cleanup around it). The first error stops
// the series and is returned with the iteration it happened in.
func series(ctx context.Context, warmup, n int, op func(ctx context.Context) (time.Duration, error)) ([]time.Duration, error) {
	samples := make([]time.Duration, 0, n)
	for i := 0; i < warmup+n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := op(ctx)
		if err != nil {
			if i < warmup {
				return nil, fmt.Errorf("warm-up %d: %w", i+1, err)
			}
			return nil, fmt.Errorf("iteration %d: %w", i-warmup+1, err)
		}
		if i >= warmup {
			samples = append(samples, d)
		}
	}
	return samples, nil
}

// timed runs f and returns how long it took (wall clock, monotonic).
func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}
