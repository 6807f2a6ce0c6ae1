package btrfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/forkbox/forkbox/storage"
)

// TestStagedLayers: layers made at once from one snapshot each get the
// snapshot's files and leave no staging directory behind; their base
// (read once, then from the cache) is the snapshot's referenced bytes; a
// staging directory a crash left, with its snapshot still in it, is gone
// after the next New, and the layer it was for does not exist.
func TestStagedLayers(t *testing.T) {
	d, _ := newWithTemplate(t)
	ctx := context.Background()
	rootfs, err := d.Prepare(ctx, "src", storage.Source{Template: "t"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(rootfs, "home/user/data"), 1<<20, 'd'); err != nil {
		t.Fatal(err)
	}
	info, err := d.Snapshot(ctx, "src", "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := d.usageBytes(d.snapPath(info.ID), false)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = d.Prepare(ctx, fmt.Sprintf("c%d", i), storage.Source{Snapshot: info.ID}, 8<<20)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		var lm layerMeta
		if err := storage.ReadJSON(d.layerPath(fmt.Sprintf("c%d", i))+".json", &lm, "layer"); err != nil {
			t.Fatal(err)
		}
		if lm.BaseReferenced != want.Referenced {
			t.Fatalf("child %d: base %d, the snapshot references %d", i, lm.BaseReferenced, want.Referenced)
		}
		if b, err := os.ReadFile(filepath.Join(d.layerPath(fmt.Sprintf("c%d", i)), "home/user/data")); err != nil || len(b) != 1<<20 {
			t.Fatalf("child %d reads %d bytes (%v)", i, len(b), err)
		}
	}
	entries, _ := os.ReadDir(d.layersDir())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), stagePrefix) {
			t.Fatalf("staging directory %s left behind", e.Name())
		}
	}
	// A crash between the snapshot and its move.
	stage := filepath.Join(d.layersDir(), stagePrefix+"half")
	if err := os.Mkdir(stage, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := snapshotInto(d.snapPath(info.ID), stage, "half", false); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d2, err := New(ctx, Options{Dir: d.dir, Shift: storage.DefaultIDShift})
	if err != nil {
		t.Fatalf("second New: %v", err)
	}
	defer d2.Close()
	if _, err := os.Lstat(stage); !os.IsNotExist(err) {
		t.Fatalf("staging directory after restart: %v", err)
	}
	ls, _ := d2.Layers(ctx)
	if len(ls) != 9 {
		t.Fatalf("layers after restart %v (src and 8 children)", ls)
	}
	for _, id := range ls {
		if err := d2.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := d2.RemoveSnapshot(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
}
