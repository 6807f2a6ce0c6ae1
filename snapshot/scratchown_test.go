package snapshot

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/node"
)

// TestScratchNotOurs: the scratch directory of decrypted checkpoints has
// a name anyone can compute, in the world-writable /dev/shm. One made
// there first by another user (who could rename, replace or plant the
// images in it) gets no plaintext: a seal keeps no copy in it and a
// restore refuses, naming it.
func TestScratchNotOurs(t *testing.T) {
	e := newEnv(t)
	e.s.cacheBytes = 1 << 20
	ctx := context.Background()
	scratch := e.layout.Scratch()
	os.RemoveAll(scratch)
	if err := os.Mkdir(scratch, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(scratch, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(scratch, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	data := strings.Repeat("memory", 1000)
	sn := &node.Snapshot{ID: node.NewID(), MemoryDriver: "gvisor", MemoryBytes: int64(len(data)), CreatedAt: time.Now()}
	p := e.s.beginSeal(sn.ID)
	if err := e.st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	e.s.sealLater(&memoryCapture{driver: "gvisor", dir: checkpointDir(t, data)}, *sn, p)
	<-p.done
	if p.err != nil {
		t.Fatalf("seal: %v", p.err)
	}
	if left, _ := filepath.Glob(filepath.Join(scratch, "restore-*")); len(left) != 0 {
		t.Fatalf("plaintext copies %v in a scratch directory another user owns", left)
	}
	dir, _, release, err := e.s.OpenMemory(sn)
	if err == nil {
		release()
		t.Fatalf("restore decrypted into %s, in a scratch directory another user owns", dir)
	}
	if !strings.Contains(err.Error(), scratch) {
		t.Fatalf("restore: %v, want an error naming %s", err, scratch)
	}
}
