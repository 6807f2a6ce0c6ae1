package snapshot

import (
	"context"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/node"
)

// scratchBytes is the bytes of the decrypted copies in scratch dir.
func scratchBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// TestSealCopiesWithinCache: memory snapshots sealed at the same time
// write their image-cache copies within the cache's bound together, not
// each within it (four 3 MiB checkpoints and a 4 MiB cache never hold
// more than 4 MiB of plaintext in the scratch tmpfs), and the last one
// sealed is kept.
func TestSealCopiesWithinCache(t *testing.T) {
	e := newEnv(t)
	e.s.cacheBytes = 4 << 20
	ctx := context.Background()
	data := strings.Repeat("m", 3<<20)
	var most int64
	stop := make(chan struct{})
	var polled sync.WaitGroup
	polled.Add(1)
	go func() {
		defer polled.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := scratchBytes(e.layout.Scratch()); n > most {
				most = n
			}
		}
	}()
	var ps []*pendingSeal
	for range 4 {
		sn := &node.Snapshot{ID: node.NewID(), MemoryDriver: "gvisor", MemoryBytes: int64(len(data)), CreatedAt: time.Now()}
		p := e.s.beginSeal(sn.ID)
		if err := e.st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		e.s.sealLater(&memoryCapture{driver: "gvisor", dir: checkpointDir(t, data)}, *sn, p)
		ps = append(ps, p)
	}
	for _, p := range ps {
		<-p.done
		if p.err != nil {
			t.Fatal(p.err)
		}
	}
	close(stop)
	polled.Wait()
	if most > e.s.cacheBytes {
		t.Fatalf("plaintext copies in scratch reached %d bytes, past the %d-byte cache", most, e.s.cacheBytes)
	}
	if n := scratchBytes(e.layout.Scratch()); n != int64(len(data)) {
		t.Fatalf("after the seals scratch holds %d bytes, want one kept copy (%d)", n, len(data))
	}
}
