package storage

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// MaxImageBytes is the largest default size of a storage driver's own
// volume image.
const MaxImageBytes = 64 << 30

// DefaultImageBytes returns the size, in bytes, of the volume image a
// storage driver makes under dir when none was asked for: half of what the
// host's filesystem has free there (for unprivileged users), at most
// MaxImageBytes and at least 1 GiB (1 GiB when dir cannot be examined).
// It is the only place this default is decided: `forkbox serve` and the
// daemon pass 0 for it.
func DefaultImageBytes(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 1 << 30
	}
	free := int64(st.Bavail) * st.Bsize
	return max(min(free/2, MaxImageBytes), 1<<30)
}

// Preallocate reserves size bytes of real disk for the open file f. A
// storage volume (a loop-mounted image) must never be short of the blocks
// it believes it has: a sparse image on a filling host disk gets write
// errors under the filesystem inside it, which then loses acknowledged
// data and turns read-only for every sandbox. With the space reserved, a
// full volume is an ordinary ENOSPC. ErrInsufficientStorage when the host
// has not that much free.
func Preallocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("reserve %d MiB for %s: the host's disk has not that much free: %w",
			size>>20, f.Name(), errdefs.ErrInsufficientStorage)
	}
	if err != nil {
		return fmt.Errorf("reserve %d MiB for %s: %w", size>>20, f.Name(), err)
	}
	return nil
}
