package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/errdefs"
)

// TestGVisorMemorySnapshotReplicated proves a sealed memory checkpoint is
// copied to the fleet's object store once its snapshot is taken: the
// snapshot's record says when, the stored copy comes back byte for byte
// the sealed files (still encrypted) and checks against the manifest
// digest, and deleting the snapshot deletes the copy.
func TestGVisorMemorySnapshotReplicated(t *testing.T) {
	needGVisor(t)
	// A host alone copies nothing unless told to (its own disk would hold
	// every checkpoint twice): a daemon of the test's own that is.
	o := newOwnDaemonWith(t, func(opts *daemon.Options) { opts.Fleet.ReplicateAlone = true })
	src, _, err := o.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Isolation: "gvisor"}, "")
	if err != nil {
		t.Fatal(err)
	}
	sn, err := o.c.SnapshotWith(ctxFor(t, 2*time.Minute), src.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	objs := o.d.SnapshotObjects()
	if objs == nil {
		t.Fatal("the daemon has no snapshot object store")
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := o.c.GetSnapshot(ctxFor(t, time.Minute), sn.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.MemoryReplicatedAt != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot %s not recorded as copied after 2 minutes", sn.ID)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sealed := filepath.Join(o.dataDir, "memory", sn.ID)
	manifest, err := os.ReadFile(filepath.Join(sealed, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	dst := filepath.Join(t.TempDir(), sn.ID)
	if err := objs.Get(ctxFor(t, time.Minute), sn.ID, digest, dst); err != nil {
		t.Fatal(err)
	}
	des, err := os.ReadDir(sealed)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		a, err := os.ReadFile(filepath.Join(sealed, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dst, de.Name()))
		if err != nil || !bytes.Equal(a, b) {
			t.Fatalf("%s: the stored copy differs from the sealed file (%v)", de.Name(), err)
		}
	}
	if err := o.c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		err := objs.Get(ctxFor(t, time.Minute), sn.ID, digest, filepath.Join(t.TempDir(), "again"))
		return errors.Is(err, errdefs.ErrNotFound)
	})
}
