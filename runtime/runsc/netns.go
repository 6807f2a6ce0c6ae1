package runsc

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// nullNetNS is the file in runsc's state root on which runsc (2025 and
// later) bind-mounts the empty network namespace its gofers share: the
// first gofer of a root creates it, later ones join it instead of making
// their own. Nothing removes the mount by itself, so the state root could
// not be removed after the daemon stopped (EBUSY).
const nullNetNS = "null-netns"

// ReleaseRoot unmounts what runsc keeps mounted in its state root root
// (the shared null network namespace; sandboxes that joined it keep it
// alive, later ones make a new one). The daemon calls it when it stops and
// forkbox down when it has taken a data directory down. Nothing mounted is
// fine.
func ReleaseRoot(root string) error {
	p := filepath.Join(root, nullNetNS)
	// Concurrent first starts may stack mounts there: unmount them all.
	for i := 0; i < 64; i++ {
		err := unix.Unmount(p, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return errors.New(p + ": still mounted after 64 unmounts")
}

// idle reports whether runsc's state root holds no sandbox's state file.
func (d *Driver) idle() bool {
	entries, err := os.ReadDir(d.root)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".state") {
			return false
		}
	}
	return true
}

// releaseIfIdle unmounts the shared null network namespace once the last
// sandbox is deleted, so that no mount of runsc's outlives the sandboxes
// (a sandbox starting meanwhile joins the namespace first or makes a new
// one: both are empty namespaces).
func (d *Driver) releaseIfIdle() error {
	if !d.idle() {
		return nil
	}
	return ReleaseRoot(d.root)
}
