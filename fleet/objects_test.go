package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage/seal"
)

// sealed makes a sealed directory of files (name → size random bytes)
// under a fresh key, as the snapshot service seals a memory checkpoint,
// and returns it, its digest, the key and the plaintexts.
func sealed(t *testing.T, files map[string]int) (dir, digest string, key *seal.Key, plain map[string][]byte) {
	t.Helper()
	key = &seal.Key{}
	if _, err := rand.Read(key[:]); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	plain = map[string][]byte{}
	for name, size := range files {
		b := make([]byte, size)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		plain[name] = b
		if err := os.WriteFile(filepath.Join(src, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir = filepath.Join(t.TempDir(), "sealed")
	digest, _, err := seal.SealDir(key, src, dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, digest, key, plain
}

// sameFiles fails unless dirs a and b hold the same files, byte for byte.
func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	des, err := os.ReadDir(a)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadDir(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(des) != len(got) {
		t.Fatalf("%d files, want %d", len(got), len(des))
	}
	for _, de := range des {
		x, err := os.ReadFile(filepath.Join(a, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Fatalf("%s differs from the sealed bytes", de.Name())
		}
	}
}

// noLeftovers fails unless dir is empty.
func noLeftovers(t *testing.T, dir string) {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		t.Errorf("left behind: %s", de.Name())
	}
}

// TestObjectsPutGet puts a sealed snapshot of several chunks on a
// three-node cluster through node a and gets it through node c: the
// copy is byte for byte the sealed files (still encrypted) and opens
// with the key; the object store has three replicas; with node b
// stopped the snapshot still gets through c.
func TestObjectsPutGet(t *testing.T) {
	nodes := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	oa, err := OpenObjects(ctx, nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	oc, err := OpenObjects(ctx, nodes[2])
	if err != nil {
		t.Fatal(err)
	}
	if s, err := nodes[1].js.Stream(ctx, "OBJ_"+SnapshotsBucket); err != nil {
		t.Fatal(err)
	} else if r := s.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("object store: %d replicas, want 3", r)
	}
	dir, digest, key, plain := sealed(t, map[string]int{"pages.img": 3*ObjectChunkBytes + 1234, "core.img": 5000})
	if err := oa.Put(ctx, "snap1", dir, digest); err != nil {
		t.Fatal(err)
	}
	get := func(o *JetStreamObjects) {
		t.Helper()
		out := t.TempDir()
		dst := filepath.Join(out, "snap1")
		if err := o.Get(ctx, "snap1", digest, dst); err != nil {
			t.Fatal(err)
		}
		sameFiles(t, dir, dst)
		open := filepath.Join(t.TempDir(), "open")
		if err := seal.OpenDir(key, dst, digest, open); err != nil {
			t.Fatal(err)
		}
		for name, want := range plain {
			if got, err := os.ReadFile(filepath.Join(open, name)); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s after the round trip: %v", name, err)
			}
		}
	}
	get(oc)
	nodes[1].Close()
	waitFor(t, 30*time.Second, "the object stream led by a or c", func() bool {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s, err := nodes[2].js.Stream(sctx, "OBJ_"+SnapshotsBucket)
		if err != nil {
			return false
		}
		cl := s.CachedInfo().Cluster
		return cl != nil && (cl.Leader == "a" || cl.Leader == "c")
	})
	get(oc)
}

// TestObjectsRefuseCorruption proves every copy is checked: a snapshot
// object replaced in the store, a wrong recorded digest and a sealed file
// changed on disk before the upload are each refused (ErrConflict) and
// leave nothing; a snapshot never put is ErrNotFound.
func TestObjectsRefuseCorruption(t *testing.T) {
	f := startAlone(t)
	ctx := context.Background()
	o, err := OpenObjects(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	dir, digest, _, _ := sealed(t, map[string]int{"pages.img": ObjectChunkBytes + 10})
	if err := o.Put(ctx, "snap1", dir, digest); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	dst := filepath.Join(out, "snap1")
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("%s: %v, want a conflict (integrity check)", what, err)
		}
		noLeftovers(t, out)
	}
	refused("wrong digest", o.Get(ctx, "snap1", "sha256:"+string(bytes.Repeat([]byte("0"), 64)), dst))

	// The stored object of a file is replaced with other bytes of the
	// same length: the manifest's sha256 catches it.
	sealedBytes, err := os.ReadFile(filepath.Join(dir, "pages.img"))
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(sealedBytes)
	bad[len(bad)/2] ^= 0xff
	if _, err := o.obs.PutBytes(ctx, objectName("snap1", "pages.img"), bad); err != nil {
		t.Fatal(err)
	}
	refused("corrupted object", o.Get(ctx, "snap1", digest, dst))

	// An object longer than its manifest entry allows is refused once
	// past that length, not read to its end first.
	if _, err := o.obs.PutBytes(ctx, objectName("snap1", "pages.img"), append(bytes.Clone(sealedBytes), make([]byte, 8<<20)...)); err != nil {
		t.Fatal(err)
	}
	err = o.Get(ctx, "snap1", digest, dst)
	refused("oversized object", err)
	if !strings.Contains(err.Error(), "more than the") {
		t.Fatalf("oversized object: %v, want it stopped at its sealed size", err)
	}

	// The object is gone altogether.
	if err := o.obs.Delete(ctx, objectName("snap1", "pages.img")); err != nil {
		t.Fatal(err)
	}
	refused("missing object", o.Get(ctx, "snap1", digest, dst))

	// A sealed file changed on disk after sealing is refused at upload,
	// and nothing of the snapshot stays stored.
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := o.Put(ctx, "snap2", dir, digest); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("put of a changed file: %v, want a conflict", err)
	}
	if err := o.Get(ctx, "snap2", digest, dst); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after a refused put: %v, want not found", err)
	}
	if err := o.Get(ctx, "never", digest, dst); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get of a snapshot never put: %v, want not found", err)
	}
	noLeftovers(t, out)
	if err := o.Delete(ctx, "snap1"); err != nil {
		t.Fatal(err)
	}
	if list, err := o.obs.List(ctx); err == nil && len(list) > 0 {
		t.Fatalf("after the deletes %d objects are left", len(list))
	}
}

// TestCacheEviction fills a cache bounded to a bit over two snapshots
// with three: the least recently used one that no caller holds goes
// first, a held one is kept until released, a cached copy changed on
// disk is pulled again, and a reopened cache keeps what it had.
func TestCacheEviction(t *testing.T) {
	f := startAlone(t)
	ctx := context.Background()
	o, err := OpenObjects(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{}
	var size int64
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		dir, digest, _, _ := sealed(t, map[string]int{"pages.img": 100 << 10})
		if err := o.Put(ctx, id, dir, digest); err != nil {
			t.Fatal(err)
		}
		digests[id] = digest
		if size == 0 {
			if size, err = dirSize(dir); err != nil {
				t.Fatal(err)
			}
		}
	}
	cdir := t.TempDir()
	c, err := OpenCache(cdir, 2*size+size/2, o)
	if err != nil {
		t.Fatal(err)
	}
	open := func(id string) (string, func()) {
		t.Helper()
		dir, release, err := c.Open(ctx, id, digests[id])
		if err != nil {
			t.Fatalf("open %s: %v", id, err)
		}
		return dir, release
	}
	want := func(ids ...string) {
		t.Helper()
		got := c.IDs()
		if len(got) != len(ids) {
			t.Fatalf("cache holds %v, want %v (least recently used first)", got, ids)
		}
		for i := range ids {
			if got[i] != ids[i] {
				t.Fatalf("cache holds %v, want %v (least recently used first)", got, ids)
			}
		}
		for _, id := range ids {
			if _, err := os.Stat(filepath.Join(cdir, id)); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
		}
	}
	_, r1 := open("s1")
	r1()
	_, r2 := open("s2")
	r2()
	_, r1 = open("s1") // s1 is now the most recently used
	r1()
	_, r3 := open("s3")
	r3()
	want("s1", "s3") // s2, least recently used, went
	if _, err := os.Stat(filepath.Join(cdir, "s2")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("evicted s2 still on disk: %v", err)
	}

	// A held snapshot stays while held, even when least recently used.
	_, r1 = open("s1")
	_, r3 = open("s3")
	r3()
	_, r4 := open("s4")
	r4()
	want("s1", "s4")
	_, r2 = open("s2") // over the bound while s1 is held: s4 goes
	r2()
	want("s1", "s2")
	r1()

	// A cached copy changed on disk fails its check and is pulled again.
	d2, r2 := open("s2")
	r2()
	p := filepath.Join(d2, "pages.img")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	d2, r2 = open("s2")
	r2()
	if err := verifyDir(d2, digests["s2"]); err != nil {
		t.Fatalf("s2 after the pull again: %v", err)
	}
	// A refused pull leaves nothing in the cache.
	if _, _, err := c.Open(ctx, "s3", digests["s1"]); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("open with a wrong digest: %v, want a conflict", err)
	}
	want("s1", "s2")

	// Reopened, the cache keeps its snapshots and their order.
	c2, err := OpenCache(cdir, 2*size+size/2, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := c2.IDs(); len(got) != 2 || c2.Bytes() != c.Bytes() {
		t.Fatalf("reopened cache holds %v (%d bytes), want s1 and s2 (%d bytes)", got, c2.Bytes(), c.Bytes())
	}
}
