package snapshot

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/overlay"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
)

// layerCore is a Core over a real store and a real storage driver, without
// sandboxes: a session is its record and its writable layer. Create makes
// both (the layer from the snapshot), Destroy ends the record and removes
// the layer. Find is refused: these tests take snapshots of layers through
// the driver, not of running sandboxes (the sandbox package's tests and
// the e2e suite do that).
type layerCore struct {
	t     *testing.T
	st    *store.Store
	drv   storage.Driver
	mu    sync.Mutex // guards n and limit (a fork creates concurrently)
	n     int
	limit int // CreateVerified fails from the limit-th session on (0: never)
}

func (c *layerCore) Find(ctx context.Context, id string) (Held, error) {
	return nil, errdefs.Newf(errdefs.ErrConflict, "session %s has no sandbox in this test", id)
}

func (c *layerCore) Get(ctx context.Context, id string) (*node.Session, error) {
	return c.st.GetSession(ctx, id)
}

// CreateVerified makes a session record on spec.Snapshot and its layer.
func (c *layerCore) CreateVerified(ctx context.Context, spec node.CreateSpec) (*node.Session, error) {
	c.mu.Lock()
	c.n++
	full := c.limit > 0 && c.n >= c.limit
	c.mu.Unlock()
	if full {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "the host is full")
	}
	sn, err := c.st.GetSnapshot(ctx, spec.Snapshot)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	rec := &node.Session{ID: node.NewID(), Template: sn.Template, Snapshot: sn.ID, State: node.StateRunning,
		Driver: "layer", CPU: 1, MemoryMB: 512, Pids: 64, TimeoutS: 60, CreatedAt: now, StartedAt: now,
		ExpiresAt: now.Add(time.Minute), Tenant: sn.Tenant}
	if err := c.st.CreateSession(ctx, rec); err != nil {
		return nil, err
	}
	if _, err := c.drv.Prepare(ctx, rec.ID, storage.Source{Snapshot: sn.ID}, 64<<20); err != nil {
		return nil, err
	}
	c.t.Cleanup(func() { _ = c.drv.Remove(context.Background(), rec.ID) })
	return rec, nil
}

func (c *layerCore) Destroy(ctx context.Context, id string) error {
	rec, err := c.st.GetSession(ctx, id)
	if err != nil {
		return err
	}
	if err := c.drv.Remove(ctx, id); err != nil {
		return err
	}
	rec.State, rec.Reason = node.StateTerminated, node.ReasonDeleted
	return c.st.UpdateSession(ctx, rec)
}

func (c *layerCore) CheckCreate(spec *node.CreateSpec) error { return nil }

func (c *layerCore) TemplateUsable(ctx context.Context, name string) bool {
	return name == testTemplate
}

func (c *layerCore) ReserveQuota(context.Context, string, string, func() (int, error)) (func(), error) {
	return func() {}, nil
}

// Exec is refused: the storage-level tests run no commands (fork and
// run is tested with real sandboxes in e2e).
func (c *layerCore) Exec(context.Context, string, node.ExecSpec, node.Output) (*node.ExecResult, error) {
	return nil, errdefs.Newf(errdefs.ErrUnavailable, "no sandboxes in this test")
}

// testTemplate is the template the layers start from.
const testTemplate = "t1"

// env is one test's service over real SQLite and the overlay driver.
type env struct {
	s      *Service
	core   *layerCore
	st     *store.Store
	drv    storage.Driver
	layout datadir.Layout
}

// newEnv opens a store, an overlay driver and a layout in a fresh
// directory that the sandbox id range can traverse, with template t1.
// Everything mounted is unmounted when the test ends.
func newEnv(t *testing.T) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the overlay storage driver needs root (loop devices, mounts)")
	}
	if err := overlay.Supported(); err != nil {
		t.Skipf("the overlay storage driver cannot run here: %v", err)
	}
	base, err := os.MkdirTemp("", "forkbox-snapshot-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	layout, err := datadir.New(filepath.Join(base, "data"))
	if err != nil {
		t.Fatal(err)
	}
	drvDir := filepath.Join(base, "overlay")
	t.Cleanup(func() {
		if unmountUnder(t, base) {
			os.RemoveAll(base) // (never through a mount left in place)
		}
		os.RemoveAll(layout.Scratch())
	})
	drv, err := overlay.New(ctx, overlay.Options{Dir: drvDir, ImageBytes: 1 << 30, Shift: storage.DefaultIDShift})
	if err != nil {
		t.Fatalf("overlay: %v", err)
	}
	st, err := store.Open(ctx, filepath.Join(base, "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rootfs := filepath.Join(base, "template")
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "hello"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := storage.PrepareUserDirs(rootfs, storage.DefaultIDShift); err != nil {
		t.Fatal(err)
	}
	if err := drv.AddTemplate(ctx, testTemplate, rootfs, "v1"); err != nil {
		t.Fatalf("AddTemplate: %v", err)
	}
	key, err := seal.LoadKey(filepath.Join(base, "snapshot.key"))
	if err != nil {
		t.Fatal(err)
	}
	core := &layerCore{t: t, st: st, drv: drv}
	s := New(Options{Core: core, Store: st, Storage: drv, Layout: layout, Key: key,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return &env{s: s, core: core, st: st, drv: drv, layout: layout}
}

// unmountUnder unmounts every mount point under dir (deepest first) and
// reports whether none is left; the overlay volume's loop device detaches
// with its mount. A layer disk's loop device detaches just after its
// unmount and holds the volume until then, so busy unmounts are retried
// for a while.
func unmountUnder(t *testing.T, dir string) bool {
	deadline := time.Now().Add(20 * time.Second)
	for {
		points, err := mountsUnder(dir)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return false
		}
		if len(points) == 0 {
			return true
		}
		var busy error
		for _, p := range points {
			if err := unix.Unmount(p, 0); err != nil && err != unix.EINVAL {
				busy = fmt.Errorf("unmount %s: %w", p, err)
			}
		}
		if busy != nil && time.Now().After(deadline) {
			t.Errorf("cleanup: %v", busy)
			return false
		}
		if busy != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// mountsUnder lists the mount points at or under dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	return points, sc.Err()
}

// layer makes session id's writable layer from src with file name
// holding content, and removes it when the test ends.
func (e *env) layer(t *testing.T, id string, src storage.Source, name, content string) {
	t.Helper()
	ctx := context.Background()
	rootfs, err := e.drv.Prepare(ctx, id, src, 64<<20)
	if err != nil {
		t.Fatalf("Prepare %s: %v", id, err)
	}
	t.Cleanup(func() { _ = e.drv.Remove(context.Background(), id) })
	if err := os.WriteFile(filepath.Join(rootfs, "home", "user", name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// snap snapshots layer id through the driver and records it as take
// does, returning the record.
func (e *env) snap(t *testing.T, layer, tenant string, mutate func(*node.Snapshot)) *node.Snapshot {
	t.Helper()
	ctx := context.Background()
	id := node.NewID()
	info, err := e.drv.Snapshot(ctx, layer, id, nil)
	if err != nil {
		t.Fatalf("Snapshot %s: %v", layer, err)
	}
	sn := &node.Snapshot{ID: id, SessionID: layer, Parent: info.Parent, Template: info.Template, Storage: e.drv.Name(),
		SizeBytes: info.SizeBytes, Digest: info.Digest, CreatedAt: info.CreatedAt.UTC(), Tenant: tenant}
	if mutate != nil {
		mutate(sn)
	}
	if err := e.st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	return sn
}

// stored reports which of ids the store and the driver still have.
func (e *env) stored(t *testing.T, ids ...string) (records, files map[string]bool) {
	t.Helper()
	ctx := context.Background()
	records, files = map[string]bool{}, map[string]bool{}
	onDisk, err := e.drv.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := e.st.GetSnapshot(ctx, id); err == nil {
			records[id] = true
		}
		for _, d := range onDisk {
			if d == id {
				files[id] = true
			}
		}
	}
	return records, files
}
