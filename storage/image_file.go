package storage

import "golang.org/x/sys/unix"

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
