package overlay

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/storagetest"
)

// TestConformance runs the shared storage.Driver suite against the
// overlay driver.
func TestConformance(t *testing.T) {
	skipUnlessSupported(t)
	storagetest.Run(t, func(t *testing.T, dir string) (storage.Driver, storagetest.Tamper) {
		d := openDriver(t, dir)
		return d, func(t *testing.T, snapID string) { tamper(t, d, snapID) }
	})
}

// tamper appends a byte to the first regular file in snapshot snapID's
// layer (or changes the layer root's mode when it has none).
func tamper(t *testing.T, d *Driver, snapID string) {
	t.Helper()
	root := d.snapLayer(snapID)
	var victim string
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err == nil && victim == "" && e.Type().IsRegular() {
			victim = p
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if victim == "" {
		if err := os.Chmod(root, 0o700); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.OpenFile(victim, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
}
