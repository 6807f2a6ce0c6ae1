package template

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/storage"
)

// TestSweepTempRemovesInterruptedUploads: an upload spool left by a daemon
// that died mid-upload (it can be gigabytes) is removed at the next start,
// like an interrupted import's directory; templates are kept.
func TestSweepTempRemovesInterruptedUploads(t *testing.T) {
	layout, err := datadir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := layout.Templates()
	for _, d := range []string{".tmp-0123abcd/rootfs", "base/rootfs", "my.tpl/rootfs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	spool, err := os.CreateTemp(dir, UploadPattern)
	if err != nil {
		t.Fatal(err)
	}
	spool.Close()
	c := NewCatalog(layout, nil, storage.DefaultIDShift, nil, nil)
	c.SweepTemp()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if len(left) != 2 || left[0] != "base" || left[1] != "my.tpl" {
		t.Fatalf("after SweepTemp: %q, want only the templates", left)
	}
}
