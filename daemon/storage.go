package daemon

import (
	"errors"

	"context"
	"fmt"
	"log/slog"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/btrfs"
	"github.com/forkbox/forkbox/storage/overlay"
)

// openStorage opens the storage driver opts.Storage names ("btrfs",
// "overlay") in the data directory, sized and bounded by opts; "" picks
// btrfs when this host supports it (O(1) snapshots and forks) and overlay
// otherwise.
func openStorage(ctx context.Context, layout datadir.Layout, opts Options, log *slog.Logger) (storage.Driver, error) {
	kind := opts.Storage
	if kind == "" {
		if err := btrfs.Supported(); err != nil {
			log.Warn("btrfs storage unavailable; using overlay", "why", err)
			kind = "overlay"
		} else {
			kind = "btrfs"
		}
	}
	switch kind {
	case "btrfs":
		return btrfs.New(ctx, btrfs.Options{Dir: layout.Storage("btrfs"), ImageBytes: opts.StorageImageBytes,
			Shift: storage.DefaultIDShift, MaxSnapshotEntries: opts.MaxSnapshotEntries, Logger: log})
	case "overlay":
		return overlay.New(ctx, overlay.Options{Dir: layout.Storage("overlay"), ImageBytes: opts.StorageImageBytes,
			Shift: storage.DefaultIDShift, MaxSnapshotEntries: opts.MaxSnapshotEntries})
	}
	return nil, fmt.Errorf("storage %q: %w (want btrfs or overlay)", kind, errdefs.ErrInvalidArgument)
}

// ReleaseStorage detaches the storage volumes a daemon on dataDir mounted
// (the loop-mounted btrfs or XFS images), lazily: call it after Shutdown
// once no sandbox runs any more. Down releases everything else the daemon
// left on the host as well, and waits for the loop devices to go. Sandboxes still running keep
// their files (the detach is lazy). A volume that is not mounted is fine.
func ReleaseStorage(dataDir string) error {
	layout, err := datadir.New(dataDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range []string{"btrfs", "overlay"} {
		dir := layout.Storage(name)
		if !isMountPoint(dir) {
			continue
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// isMountPoint reports whether dir is on another filesystem than its parent.
func isMountPoint(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(dir+"/..", &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}
