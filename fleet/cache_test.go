package fleet

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestCacheOverBound opens a snapshot larger than the cache's whole
// bound: it is pulled once, handed out and kept while held (not evicted
// the moment it is added, nor pulled over and over), and goes once
// released.
func TestCacheOverBound(t *testing.T) {
	f := startAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o, err := OpenObjects(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	dir, digest, _, _ := sealed(t, map[string]int{"pages.img": 200 << 10})
	if err := o.Put(ctx, "big", dir, digest); err != nil {
		t.Fatal(err)
	}
	c, err := OpenCache(t.TempDir(), 10<<10, o)
	if err != nil {
		t.Fatal(err)
	}
	got, release, err := c.Open(ctx, "big", digest)
	if err != nil {
		t.Fatalf("open a snapshot over the bound: %v", err)
	}
	if err := verifyDir(got, digest); err != nil {
		t.Fatalf("held copy: %v", err)
	}
	if c.Bytes() == 0 {
		t.Fatal("a held copy is not counted")
	}
	release()
	if _, err := os.Stat(got); !os.IsNotExist(err) || c.Bytes() != 0 {
		t.Fatalf("released copy over the bound: stat %v, %d bytes held", err, c.Bytes())
	}
}

// gatedObjects holds each Get until gate is closed (to have a pull under
// way while another caller asks for the same snapshot).
type gatedObjects struct {
	Objects
	started chan struct{}
	gate    chan struct{}
}

func (g *gatedObjects) Get(ctx context.Context, id, digest, dst string) error {
	select {
	case g.started <- struct{}{}:
	default:
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Objects.Get(ctx, id, digest, dst)
}

// TestCacheWaiterOutlivesPuller: a caller waiting on another's pull of
// the same snapshot is not failed by that caller's cancellation; it
// pulls the snapshot itself.
func TestCacheWaiterOutlivesPuller(t *testing.T) {
	f := startAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o, err := OpenObjects(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	dir, digest, _, _ := sealed(t, map[string]int{"pages.img": 10 << 10})
	if err := o.Put(ctx, "s1", dir, digest); err != nil {
		t.Fatal(err)
	}
	g := &gatedObjects{Objects: o, started: make(chan struct{}, 1), gate: make(chan struct{})}
	c, err := OpenCache(t.TempDir(), 1<<20, g)
	if err != nil {
		t.Fatal(err)
	}
	first, cancelFirst := context.WithCancel(ctx)
	firstDone := make(chan error, 1)
	go func() {
		_, _, err := c.Open(first, "s1", digest)
		firstDone <- err
	}()
	<-g.started
	second := make(chan error, 1)
	go func() {
		_, release, err := c.Open(ctx, "s1", digest)
		if err == nil {
			release()
		}
		second <- err
	}()
	// The second caller waits on the first's pull (give it the time to
	// get there), then the first gives up.
	time.Sleep(200 * time.Millisecond)
	cancelFirst()
	if err := <-firstDone; err == nil {
		t.Fatal("the cancelled caller's open succeeded")
	}
	close(g.gate)
	if err := <-second; err != nil {
		t.Fatalf("the waiting caller failed with the other's cancellation: %v", err)
	}
}
