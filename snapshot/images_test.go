package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/tenancy"
)

// sealedSnapshot seals a checkpoint holding data for a new snapshot
// id and returns its record (not stored).
func sealedSnapshot(t *testing.T, e *env, data string) *node.Snapshot {
	t.Helper()
	plain := filepath.Join(t.TempDir(), "checkpoint")
	if err := os.MkdirAll(plain, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(plain, "pages.img"), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	sn := &node.Snapshot{ID: node.NewID(), MemoryDriver: "gvisor"}
	if err := e.s.sealMemory(&memoryCapture{driver: "gvisor", dir: plain}, sn, ""); err != nil {
		t.Fatal(err)
	}
	return sn
}

// open opens sn's image and fails t on an error.
func open(t *testing.T, e *env, sn *node.Snapshot) (string, func()) {
	t.Helper()
	dir, _, release, err := e.s.OpenMemory(sn)
	if err != nil {
		t.Fatal(err)
	}
	return dir, release
}

// TestImageCache: a decrypted image stays after its last restore while it
// fits the bound, and the next restore takes it as it is; one that does
// not fit, the least recently used first, is removed; a change to the
// sealed files after the image was made drops it, and the restore verifies
// them again and refuses the tampered snapshot (ErrConflict, no plaintext
// left); deleting a snapshot removes its image.
func TestImageCache(t *testing.T) {
	e := newEnv(t)
	e.s.cacheBytes = 10000
	a := sealedSnapshot(t, e, strings.Repeat("a", 6000))
	dirA, release := open(t, e, a)
	release()
	if _, err := os.Stat(filepath.Join(dirA, "pages.img")); err != nil {
		t.Fatalf("image after its last restore: %v, want it kept", err)
	}
	again, release := open(t, e, a)
	if again != dirA {
		t.Fatalf("second restore got %s, want the kept image %s", again, dirA)
	}
	if b, err := os.ReadFile(filepath.Join(again, "pages.img")); err != nil || string(b) != strings.Repeat("a", 6000) {
		t.Fatalf("kept image: %d bytes (%v)", len(b), err)
	}
	release()

	// b does not fit beside a: a, the older, goes.
	b := sealedSnapshot(t, e, strings.Repeat("b", 6000))
	dirB, release := open(t, e, b)
	release()
	if _, err := os.Stat(dirA); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("older image over the bound: %v, want removed", err)
	}
	if _, err := os.Stat(dirB); err != nil {
		t.Fatalf("newer image: %v, want kept", err)
	}
	// One larger than the bound is never kept.
	big := sealedSnapshot(t, e, strings.Repeat("c", 20000))
	dirBig, release := open(t, e, big)
	release()
	if _, err := os.Stat(dirBig); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image larger than the bound: %v, want removed", err)
	}

	// Tamper with b's sealed pages after its image was kept.
	p := filepath.Join(e.s.memoryDir(b.ID), "pages.img")
	sealed, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sealed[len(sealed)/2] ^= 1
	if err := os.WriteFile(p, sealed, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.s.OpenMemory(b); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("restore of a snapshot tampered with after its image was kept: %v, want conflict", err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.layout.Scratch(), "restore-"+b.ID+"-*")); len(left) != 0 {
		t.Fatalf("plaintext left after a refused restore: %v", left)
	}

	// Deleting a snapshot removes its kept image.
	e.layer(t, "layerc", storage.Source{Template: testTemplate}, "f", "x")
	c := e.snap(t, "layerc", "acme", func(sn *node.Snapshot) {
		sealed := sealedSnapshot(t, e, strings.Repeat("d", 3000))
		if err := os.Rename(e.s.memoryDir(sealed.ID), e.s.memoryDir(sn.ID)); err != nil {
			t.Fatal(err)
		}
		sn.MemoryDriver, sn.MemoryDigest, sn.MemoryBytes = sealed.MemoryDriver, sealed.MemoryDigest, sealed.MemoryBytes
	})
	dirC, release := open(t, e, c)
	release()
	if _, err := os.Stat(dirC); err != nil {
		t.Fatalf("image of c: %v, want kept", err)
	}
	acme := tenancy.With(context.Background(), tenancy.Caller{Tenant: "acme"})
	if err := e.s.DeleteSnapshot(acme, c.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dirC); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image of a deleted snapshot: %v, want removed", err)
	}
}
