package volume

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/btrfs"
	"github.com/forkbox/forkbox/store"
)

// newService returns a volume service over a real btrfs driver (a loop
// image in a temporary directory) and a real SQLite store; it skips t
// when the host cannot run btrfs.
func newService(t *testing.T) *Service {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("volumes need btrfs, which needs root (loop devices, mounts)")
	}
	if err := btrfs.Supported(); err != nil {
		t.Skipf("btrfs is not usable on this host: %v", err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	sdir := filepath.Join(dir, "btrfs")
	drv, err := btrfs.New(ctx, btrfs.Options{Dir: sdir, ImageBytes: 1 << 30, Shift: storage.DefaultIDShift})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		drv.Close()
		_ = btrfs.Unmount(sdir)
	})
	st, err := store.Open(ctx, filepath.Join(dir, "db.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st, drv, storage.DefaultIDShift, dir)
}

// TestAttachRaceRemove proves a volume removed while a create is
// attaching it (between the attach's look-up and its registration) is
// not handed to that create: the attach fails and registers nothing,
// instead of returning the directory of a deleted layer as mounted.
func TestAttachRaceRemove(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	if _, err := s.Create(ctx, "t1", "v", 4, ""); err != nil {
		t.Fatal(err)
	}
	var removeErr error
	attachLookedUp = func() { removeErr = s.Remove(ctx, "t1", "v") }
	t.Cleanup(func() { attachLookedUp = nil })
	att, err := s.Attach(ctx, "t1", "sess1", []node.VolumeMount{{Name: "v", Path: "/mnt/v"}})
	attachLookedUp = nil
	if removeErr == nil && err == nil {
		t.Fatalf("the volume was removed while attached and the attach returned %+v", att)
	}
	if err == nil {
		// The remove lost instead: the volume stays, mounted by sess1.
		if v, gerr := s.Get(ctx, "t1", "v"); gerr != nil || v.WriterSession != "sess1" {
			t.Fatalf("after a refused remove: %+v %v", v, gerr)
		}
		if _, serr := os.Stat(att[0].Source); serr != nil {
			t.Fatalf("attached layer: %v", serr)
		}
		return
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("attach of a removed volume: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.writer) != 0 || len(s.readers) != 0 {
		t.Fatalf("a failed attach registered mounts: %v %v", s.writer, s.readers)
	}
}
