package btrfs

import (
	"testing"

	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/storagetest"
)

// TestConformance runs the shared storage driver suite against the btrfs
// driver on a loop-mounted image. Tampering clears a snapshot's read-only
// flag, changes a file and sets the flag again.
func TestConformance(t *testing.T) {
	needBtrfs(t)
	storagetest.Run(t, func(t *testing.T, dir string) (storage.Driver, storagetest.Tamper) {
		d := openDriver(t, dir)
		return d, func(t *testing.T, snapID string) { tamper(t, d, snapID) }
	})
}
