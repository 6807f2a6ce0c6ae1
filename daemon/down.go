package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/host"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime/cgroupv1"
	"github.com/forkbox/forkbox/runtime/runsc"
	"github.com/forkbox/forkbox/sandbox"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/loop"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
)

// lockDataDir takes the exclusive flock on layout.Lock(), waiting up to
// wait (0: not at all) for a daemon that holds it to let go. The lock is
// held until the returned file is closed. ErrConflict when it stays held.
func lockDataDir(ctx context.Context, layout datadir.Layout, wait time.Duration) (*os.File, error) {
	f, err := os.OpenFile(layout.Lock(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", layout.Lock(), err)
		}
		if !time.Now().Before(deadline) {
			f.Close()
			return nil, errdefs.Newf(errdefs.ErrConflict, "a forkbox daemon runs on %s (it holds %s)", layout.Root, layout.Lock())
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DownOptions configure Down.
type DownOptions struct {
	// DataDir is the data directory of the daemon to take down.
	DataDir string
	// RuncPath and RunscPath are the runtimes, as for Options ("" looks in
	// PATH; without runsc gVisor sandboxes cannot be asked, only killed
	// through their cgroups).
	RuncPath, RunscPath string
	// Log receives what Down does and could not do; nil is slog.Default().
	Log *slog.Logger
}

// Down takes down what a daemon on opts.DataDir left on the host while no
// daemon runs there (ErrConflict otherwise): it destroys every sandbox of
// the data directory (sessions end with reason deleted, recorded in its
// database; warm-pool members too), removes their network namespaces and
// host links, the daemon's nftables table (and the table daemons shared
// before each had its own, once no link of theirs is left) and its cgroup
// parent, unmounts the storage volume and detaches its loop device. The
// data directory itself (database, templates, snapshots, keys) stays, so
// a later serve starts where it was; removing it is then a plain rm -rf.
// It returns how many sandboxes it destroyed.
func Down(ctx context.Context, opts DownOptions) (int, error) {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	if os.Geteuid() != 0 {
		return 0, errors.New("forkbox down must run as root (it removes namespaces, cgroups and mounts)")
	}
	if opts.DataDir == "" {
		opts.DataDir = defaults.DataDir
	}
	layout, err := datadir.New(opts.DataDir)
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(layout.Root); err != nil {
		return 0, errdefs.Newf(errdefs.ErrNotFound, "data directory %s: %v", layout.Root, err)
	}
	lock, err := lockDataDir(ctx, layout, 0)
	if err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return 0, fmt.Errorf("%w: stop it first (or run it with --stop-sessions)", err)
		}
		return 0, err
	}
	defer lock.Close()
	names := layout.HostNames()
	n, err := destroyAll(ctx, opts, layout, names, log)
	if err != nil {
		return n, err
	}
	lost, err := releaseHost(layout, names, log)
	return n + lost, err
}

// destroyAll destroys every sandbox of layout's database through a
// manager of its own (no API), as the daemon would: the runtime, the
// network and the writable layer of each go, and the records say so.
func destroyAll(ctx context.Context, opts DownOptions, layout datadir.Layout, names datadir.HostNames, log *slog.Logger) (int, error) {
	if _, err := os.Stat(layout.Database()); errors.Is(err, os.ErrNotExist) {
		return 0, nil // never served: nothing of it can run
	}
	kind := storageKind(layout)
	if kind == "" {
		return 0, nil // no storage volume: no sandbox can have a root
	}
	st, err := store.Open(ctx, layout.Database())
	if err != nil {
		return 0, err
	}
	defer st.Close()
	live, err := st.ListSessions(ctx, node.SessionFilter{States: []node.State{node.StateCreating, node.StateRunning,
		node.StatePaused, node.StateTerminating, node.StatePooled}})
	if err != nil {
		return 0, err
	}
	drivers, err := openDrivers(Options{RuncPath: opts.RuncPath, RunscPath: opts.RunscPath}, layout, names, log)
	if err != nil {
		return 0, err
	}
	sdrv, err := openStorage(ctx, layout, Options{Storage: kind}, log)
	if err != nil {
		return 0, err
	}
	defer sdrv.Close()
	snapKey, err := seal.LoadKey(layout.SnapshotKey())
	if err != nil {
		return 0, fmt.Errorf("snapshot key: %w", err)
	}
	netsvc, err := netpolicy.NewService(netpolicy.ServiceOptions{Dir: layout.Netns(), Log: log,
		Table: names.NftTable, LinkGroup: names.LinkGroup})
	if err != nil {
		log.Warn("egress service unavailable: network namespaces are removed without it", "err", err)
		netsvc = nil
	}
	ids, err := openIDs(layout)
	if err != nil {
		return 0, err
	}
	mgr := host.New(sandbox.Options{
		Layout: layout, Store: st, Drivers: drivers, SnapshotKey: snapKey, Storage: sdrv,
		AgentPath: layout.AgentBinary(), Limits: defaults.Limits(), Shift: storage.DefaultIDShift, IDs: ids, Net: netsvc,
		Log: log, Capacity: withDefaultCapacity(admission.Capacity{}), Audit: audit.New(st, log),
	}, host.Options{})
	mgr.StopPools()
	err = mgr.Recover(ctx) // adopts what runs, ends what died
	if err == nil {
		err = mgr.StopAll(ctx, "forkbox down")
	}
	mgr.Close()
	if netsvc != nil {
		netsvc.Close()
	}
	return len(live), err
}

// storageKind names the storage driver whose volume the data directory
// has ("btrfs", "overlay"), or "" for none.
func storageKind(layout datadir.Layout) string {
	for _, kind := range []string{"btrfs", "overlay"} {
		dir := layout.Storage(kind)
		if _, err := os.Stat(dir + ".img"); err == nil || isMountPoint(dir) {
			return kind
		}
		if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
			return kind
		}
	}
	return ""
}

// releaseHost removes what a daemon keeps on the host outside its data
// directory once its sandboxes are destroyed: whatever is still left of
// them (processes in its cgroups, network namespaces and links, mounts in
// the data directory: a database that lost track of a sandbox must not
// keep it alive), its nftables table (and the shared table of older
// versions when no link of theirs is left), its cgroup parent, the restore
// scratch directory in /dev/shm, and its storage volume's mount and loop
// device. It returns how many lost sandboxes it killed.
func releaseHost(layout datadir.Layout, names datadir.HostNames, log *slog.Logger) (int, error) {
	var errs []error
	cg := cgroupv1.New(names.CgroupParent)
	ids, err := cg.Sandboxes()
	if err != nil {
		errs = append(errs, err)
	} else {
		for _, id := range ids {
			log.Warn("killing what is left of a sandbox nobody knows", "session", id)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			errs = append(errs, cg.Remove(ctx, id))
			cancel()
		}
	}
	errs = append(errs, netpolicy.RemoveNetworks(layout.Netns()), unmountUnder(layout.Sandboxes()),
		runsc.ReleaseRoot(layout.RunscRoot()))
	// Host id slices of sandboxes the database lost track of.
	if ids, err := openIDs(layout); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, ids.Sweep(func(string) bool { return false }))
	}
	if names.NftTable != netpolicy.LegacyHostTable {
		errs = append(errs, netpolicy.RemoveHostRules(names.NftTable))
		if _, err := netpolicy.RetireLegacyHostTable(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, cg.RemoveParent())
	errs = append(errs, os.RemoveAll(layout.Scratch()), os.RemoveAll(layout.CheckpointScratch()))
	errs = append(errs, unmountStorage(layout, log))
	return len(ids), errors.Join(errs...)
}

// unmountStorage unmounts the storage volumes mounted in the data
// directory, then makes sure no loop device is left on one of its image
// files (they detach themselves at the unmount; one that does not within
// a few seconds is detached here).
func unmountStorage(layout datadir.Layout, log *slog.Logger) error {
	var errs []error
	for _, kind := range []string{"btrfs", "overlay"} {
		dir := layout.Storage(kind)
		if !isMountPoint(dir) {
			continue
		}
		errs = append(errs, unmountUnder(dir)) // layers of lost sandboxes
		if err := unix.Unmount(dir, 0); err != nil {
			if !errors.Is(err, unix.EBUSY) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
				continue
			}
			// Something still uses it (a shell in it): detach it lazily;
			// its loop device goes when the last user does.
			log.Warn("storage volume busy; detached lazily", "dir", dir)
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		loops := loop.Under(layout.StorageRoot())
		if len(loops) == 0 {
			break
		}
		if time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for _, dev := range loops {
			errs = append(errs, loop.Detach(dev))
		}
		break
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount below dir, deepest first (a sandbox's
// root filesystem and the gVisor agent's socket directory, left by a
// sandbox whose record was lost).
func unmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	var errs []error
	for i := len(points) - 1; i >= 0; i-- {
		if err := unix.Unmount(points[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", points[i], err))
		}
	}
	return errors.Join(errs...)
}
