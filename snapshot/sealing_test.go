package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// checkpointDir writes a plaintext checkpoint holding data and returns
// its directory.
func checkpointDir(t *testing.T, data string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "checkpoint")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRestoreWaitsForSeal: a restore of a snapshot whose checkpoint is
// still being sealed waits until sealLater has sealed it, recorded its
// digest and (with room in the image cache) kept a decrypted copy, which
// the restore then takes; the plaintext checkpoint is gone. A snapshot
// recorded as sealing with no seal under way (a daemon died meanwhile)
// is refused.
func TestRestoreWaitsForSeal(t *testing.T) {
	e := newEnv(t)
	e.s.cacheBytes = 1 << 20
	ctx := context.Background()
	data := strings.Repeat("memory", 1000)
	plain := checkpointDir(t, data)
	sn := &node.Snapshot{ID: node.NewID(), MemoryDriver: "gvisor", MemoryBytes: int64(len(data)), CreatedAt: time.Now()}
	p := e.s.beginSeal(sn.ID)
	if err := e.st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if !sn.Sealing() {
		t.Fatal("a record without a digest is not sealing")
	}
	type opened struct {
		dir     string
		release func()
		err     error
	}
	got := make(chan opened, 1)
	go func() {
		dir, _, release, err := e.s.OpenMemory(sn)
		got <- opened{dir, release, err}
	}()
	select {
	case o := <-got:
		t.Fatalf("a restore did not wait for the seal: %+v", o)
	case <-time.After(100 * time.Millisecond):
	}
	e.s.sealLater(&memoryCapture{driver: "gvisor", dir: plain}, *sn, p)
	o := <-got
	if o.err != nil {
		t.Fatal(o.err)
	}
	defer o.release()
	if b, err := os.ReadFile(filepath.Join(o.dir, "pages.img")); err != nil || string(b) != data {
		t.Fatalf("restored image: %d bytes (%v)", len(b), err)
	}
	if _, err := os.Stat(plain); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("plaintext checkpoint after the seal: %v, want removed", err)
	}
	rec, err := e.st.GetSnapshot(ctx, sn.ID)
	if err != nil || rec.Sealing() || rec.MemoryDigest == "" {
		t.Fatalf("record after the seal: %+v (%v)", rec, err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.layout.Scratch(), "restore-"+sn.ID+"-*")); len(left) != 1 || left[0] != o.dir {
		t.Fatalf("decrypted copies %v, want the primed one %s", left, o.dir)
	}

	// Recorded as sealing, no seal under way.
	lost := &node.Snapshot{ID: node.NewID(), MemoryDriver: "gvisor", MemoryBytes: 10, CreatedAt: time.Now()}
	if err := e.st.CreateSnapshot(ctx, lost); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.s.OpenMemory(lost); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("restore of a snapshot never sealed: %v, want conflict", err)
	}
}

// TestSealFailureDeletes: a seal that fails (here its sealed directory
// is in the way) deletes the snapshot, its files and its plaintext; a
// restore waiting for it fails with ErrConflict and a delete finds it
// gone.
func TestSealFailureDeletes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	layer := node.NewID()
	e.layer(t, layer, storage.Source{Template: testTemplate}, "f", "x")
	sn := e.snap(t, layer, "acme", func(sn *node.Snapshot) { sn.MemoryDriver, sn.MemoryBytes = "gvisor", 6 })
	if err := os.MkdirAll(e.s.memoryDir(sn.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	plain := checkpointDir(t, "memory")
	p := e.s.beginSeal(sn.ID)
	e.s.sealLater(&memoryCapture{driver: "gvisor", dir: plain}, *sn, p)
	if _, _, _, err := e.s.OpenMemory(sn); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("restore of a snapshot whose seal failed: %v, want conflict", err)
	}
	recs, files := e.stored(t, sn.ID)
	if recs[sn.ID] || files[sn.ID] {
		t.Fatalf("after a failed seal: records %v, files %v; want the snapshot gone", recs, files)
	}
	if _, err := os.Stat(plain); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("plaintext after a failed seal: %v", err)
	}
	if err := e.s.DeleteSnapshot(ctx, sn.ID, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete after a failed seal: %v, want not found", err)
	}
}
