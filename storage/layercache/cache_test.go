package layercache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
)

// digestOf is the sha256 digest of b.
func digestOf(b []byte) v1.Hash {
	s := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(s[:])}
}

// from is a Source serving b from registry reg, counting its downloads
// in *gets; granted is what its HEAD answers.
func from(reg string, b []byte, gets *int, granted bool) Source {
	return Source{
		Registry: reg,
		Open: func() (io.ReadCloser, error) {
			*gets++
			return io.NopCloser(bytes.NewReader(b)), nil
		},
		Granted: func() (bool, error) { return granted, nil },
	}
}

// tmpEntries lists what DIR/tmp holds.
func tmpEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestEnsureDownloadsOnceAndReusesOnlyFromTheSameRegistry(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c, err := Open(dir, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	blob := []byte("layer content")
	d := digestOf(blob)
	gets := 0
	var seen []int64
	held, err := c.Ensure(ctx, d, int64(len(blob)), from("reg.a", blob, &gets, true), func(n int64) { seen = append(seen, n) })
	if err != nil || held || gets != 1 {
		t.Fatalf("first Ensure: held %v, err %v, downloads %d; want a download", held, err, gets)
	}
	if len(seen) == 0 || seen[len(seen)-1] != int64(len(blob)) {
		t.Errorf("progress %v, want it to end at %d", seen, len(blob))
	}
	held, err = c.Ensure(ctx, d, int64(len(blob)), from("reg.a", blob, &gets, true), nil)
	if err != nil || !held || gets != 1 {
		t.Fatalf("second Ensure from the same registry: held %v, err %v, downloads %d; want it held", held, err, gets)
	}
	// The registry does not let this caller read it: downloaded again
	// (here it serves it; a real registry would refuse the GET too).
	held, err = c.Ensure(ctx, d, int64(len(blob)), from("reg.a", blob, &gets, false), nil)
	if err != nil || held || gets != 2 {
		t.Fatalf("Ensure not granted: held %v, err %v, downloads %d; want a download", held, err, gets)
	}
	// Another registry must serve the content itself.
	held, err = c.Ensure(ctx, d, int64(len(blob)), from("reg.b", blob, &gets, true), nil)
	if err != nil || held || gets != 3 {
		t.Fatalf("Ensure from another registry: held %v, err %v, downloads %d; want a download", held, err, gets)
	}
	_, meta, ok := c.Stat(d)
	if !ok || !slices.Equal(meta.Registries, []string{"reg.a", "reg.b"}) {
		t.Fatalf("Stat: %v %+v, want both registries", ok, meta)
	}
	f, err := c.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(got, blob) {
		t.Fatalf("Open reads %q", got)
	}
	if left := tmpEntries(t, dir); len(left) != 0 {
		t.Fatalf("tmp holds %v", left)
	}
}

func TestEnsureRefusesContentThatDoesNotMatch(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c, err := Open(dir, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := []byte("the layer the manifest names")
	d := digestOf(good)
	bad := bytes.Clone(good)
	bad[3] ^= 1
	gets := 0
	for name, tc := range map[string]struct {
		body []byte
		size int64
	}{
		"corrupted":  {bad, int64(len(good))},
		"too long":   {append(bytes.Clone(good), 'x'), int64(len(good))},
		"too short":  {good[:10], int64(len(good))},
		"size wrong": {good, int64(len(good)) + 1},
	} {
		_, err := c.Ensure(ctx, d, tc.size, from("reg", tc.body, &gets, true), nil)
		var me *MismatchError
		if !errors.As(err, &me) || me.Want != d.String() {
			t.Errorf("%s: %v, want a MismatchError for %s", name, err, d)
		}
		if _, _, ok := c.Stat(d); ok {
			t.Fatalf("%s: the blob is held", name)
		}
		if left := tmpEntries(t, dir); len(left) != 0 {
			t.Fatalf("%s: tmp holds %v", name, left)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "sha256", d.Hex+".json")); err == nil {
		t.Error("metadata of a blob never stored")
	}
	if _, err := c.Ensure(ctx, v1.Hash{Algorithm: "sha256", Hex: "../../etc"}, 1, from("reg", good, &gets, true), nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a digest naming a path: %v, want invalid argument", err)
	}
}

func TestEnsureCancelledLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	blob := bytes.Repeat([]byte("x"), 1<<20)
	d := digestOf(blob)
	ctx, cancel := context.WithCancel(context.Background())
	src := Source{Registry: "reg", Open: func() (io.ReadCloser, error) {
		return io.NopCloser(readerFunc(func(p []byte) (int, error) { cancel(); return copy(p, blob[:1024]), nil })), nil
	}}
	if _, err := c.Ensure(ctx, d, int64(len(blob)), src, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Ensure: %v", err)
	}
	if _, _, ok := c.Stat(d); ok || len(tmpEntries(t, dir)) != 0 {
		t.Fatal("a cancelled download left something")
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// put stores blob b in c, last used at used.
func put(t *testing.T, c *Cache, b []byte, used time.Time) v1.Hash {
	t.Helper()
	d := digestOf(b)
	gets := 0
	if _, err := c.Ensure(context.Background(), d, int64(len(b)), from("reg", b, &gets, true), nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(c.path(d), used, used); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestEvictLeastRecentlyUsedNeverInUseOrPinned(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var mu sync.Mutex
	used := map[string]bool{}
	c, err := Open(dir, 300, func(context.Context) (map[string]bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return copyOf(used), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Hour)
	blob := func(c byte) []byte { return bytes.Repeat([]byte{c}, 100) }
	a := put(t, c, blob('a'), t0)                    // oldest
	b := put(t, c, blob('b'), t0.Add(time.Minute))   // in use
	p := put(t, c, blob('p'), t0.Add(2*time.Minute)) // pinned
	d := put(t, c, blob('d'), t0.Add(3*time.Minute))
	e := put(t, c, blob('e'), t0.Add(4*time.Minute))
	f := put(t, c, blob('f'), t0.Add(5*time.Minute)) // newest
	used[b.String()] = true
	release := c.Pin(p)

	// 600 bytes held, bound 300: a goes (oldest), b stays (in use), p
	// stays (pinned), d and e go; f and b and p are 300.
	removed, err := c.Evict(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{a.String(), d.String(), e.String()}; !slices.Equal(removed, want) {
		t.Fatalf("evicted %v, want %v (least recently used first, never b in use or p pinned)", removed, want)
	}
	for _, h := range []v1.Hash{b, p, f} {
		if _, _, ok := c.Stat(h); !ok {
			t.Errorf("%s was evicted", h)
		}
	}
	if n, k, _ := c.Usage(); n != 300 || k != 3 {
		t.Fatalf("usage %d bytes in %d blobs, want 300 in 3", n, k)
	}
	if _, err := os.Stat(c.path(a) + ".json"); err == nil {
		t.Error("an evicted blob's metadata is left")
	}

	// Using a blob makes it the most recent: opening f and adding one
	// more evicts p (unpinned now), the least recently used not in use.
	release()
	if fh, err := c.Open(f); err == nil {
		fh.Close()
	}
	g := put(t, c, blob('g'), time.Now())
	removed, err = c.Evict(ctx)
	if err != nil || !slices.Equal(removed, []string{p.String()}) {
		t.Fatalf("evicted %v, %v; want only %s", removed, err, p)
	}

	// In use beyond the bound: nothing in use goes, whatever the bound.
	mu.Lock()
	used = map[string]bool{b.String(): true, f.String(): true, g.String(): true}
	mu.Unlock()
	put(t, c, bytes.Repeat([]byte{'h'}, 250), time.Now())
	removed, err = c.Evict(ctx)
	if err != nil || len(removed) != 1 {
		t.Fatalf("evicted %v, %v; want only the unused one", removed, err)
	}
	if n, _, _ := c.Usage(); n != 300 {
		t.Fatalf("usage %d, want the 300 bytes in use", n)
	}

	// A failing inUse removes nothing.
	c.inUse = func(context.Context) (map[string]bool, error) { return nil, errors.New("store down") }
	put(t, c, bytes.Repeat([]byte{'i'}, 50), time.Now())
	if removed, err := c.Evict(ctx); err == nil || len(removed) != 0 {
		t.Fatalf("Evict with inUse failing: %v, %v", removed, err)
	}
}

func copyOf(m map[string]bool) map[string]bool {
	out := map[string]bool{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestOpenSweepsLeftovers(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBytes() != DefaultMaxBytes {
		t.Errorf("default bound %d", c.MaxBytes())
	}
	d := put(t, c, []byte("kept"), time.Now())
	orphan := digestOf([]byte("gone"))
	os.WriteFile(filepath.Join(dir, "tmp", "partial"), []byte("half"), 0o600)
	os.WriteFile(filepath.Join(dir, "sha256", orphan.Hex+".json"), []byte(`{"registries":["r"]}`), 0o600)
	if _, err := Open(dir, 0, nil); err != nil {
		t.Fatal(err)
	}
	if left := tmpEntries(t, dir); len(left) != 0 {
		t.Errorf("tmp holds %v after Open", left)
	}
	if _, err := os.Stat(filepath.Join(dir, "sha256", orphan.Hex+".json")); err == nil {
		t.Error("metadata without its blob is left")
	}
	if _, _, ok := c.Stat(d); !ok {
		t.Error("a held blob was removed by Open")
	}
}

func TestConcurrentEnsureDownloadsOnce(t *testing.T) {
	c, err := Open(t.TempDir(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	blob := []byte("shared base layer")
	d := digestOf(blob)
	var mu sync.Mutex
	gets := 0
	src := Source{Registry: "reg", Open: func() (io.ReadCloser, error) {
		mu.Lock()
		gets++
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		return io.NopCloser(bytes.NewReader(blob)), nil
	}, Granted: func() (bool, error) { return true, nil }}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Ensure(context.Background(), d, int64(len(blob)), src, nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if gets != 1 {
		t.Fatalf("%d downloads of one blob by 4 pulls at once, want 1", gets)
	}
}
