package runsc

import (
	"errors"
	"os"
	"path/filepath"
)

// bundlesDir holds the driver's record of each sandbox's bundle, in the
// runsc state root (runsc only reads its own files there).
const bundlesDir = "forkbox-bundles"

// bundleRecord is the path of sandbox id's bundle record: a symbolic link
// to its bundle directory.
func (d *Driver) bundleRecord(id string) string { return filepath.Join(d.root, bundlesDir, id) }

// recordBundle records that sandbox id's bundle is dir (replacing an older
// record of the id).
func (d *Driver) recordBundle(id, dir string) error {
	p := d.bundleRecord(id)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink(dir, p)
}
