package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/pool"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/snapshot"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
)

// fakeDriver is a runtime.Driver whose Delete can be held and made to fail.
type fakeDriver struct {
	mu       sync.Mutex
	deleting chan struct{} // gets a value when Delete starts
	release  chan struct{} // Delete waits for it (when not nil)
	failures int           // Delete fails this many more times
	frozen   bool          // Pause was called more recently than Resume
	resumes  int           // Resume calls
	// creating gets a value when Create starts; Create then waits for
	// createRelease and fails (when they are not nil).
	creating, createRelease chan struct{}
}

func (d *fakeDriver) Name() string                       { return "fake" }
func (d *fakeDriver) Capabilities() runtime.Capabilities { return runtime.Capabilities{} }
func (d *fakeDriver) Create(context.Context, runtime.Config) error {
	if d.creating == nil {
		return nil
	}
	d.creating <- struct{}{}
	<-d.createRelease
	return errors.New("fake create failure")
}
func (d *fakeDriver) List(context.Context) ([]string, error) { return nil, nil }
func (d *fakeDriver) Checkpoint(context.Context, string, string) error {
	return errdefs.ErrUnavailable
}
func (d *fakeDriver) Restore(context.Context, runtime.Config, string) error {
	return errdefs.ErrUnavailable
}
func (d *fakeDriver) Pause(context.Context, string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.frozen = true
	return nil
}
func (d *fakeDriver) Resume(context.Context, string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.frozen = false
	d.resumes++
	return nil
}
func (d *fakeDriver) Stats(context.Context, string) (runtime.Stats, error) {
	return runtime.Stats{}, nil
}
func (d *fakeDriver) Status(context.Context, string) (runtime.Status, error) {
	return runtime.StatusRunning, nil
}
func (d *fakeDriver) KillProcessGroup(context.Context, string, int, int) (int, error) { return 0, nil }

func (d *fakeDriver) Delete(ctx context.Context, id string) error {
	if d.deleting != nil {
		d.deleting <- struct{}{}
	}
	if d.release != nil {
		select {
		case <-d.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failures > 0 {
		d.failures--
		return errors.New("fake delete failure")
	}
	return nil
}

// nopStorage is a storage.Driver with nothing on disk: every call succeeds.
type nopStorage struct{}

func (nopStorage) Name() string                                              { return "nop" }
func (nopStorage) AddTemplate(context.Context, string, string, string) error { return nil }
func (nopStorage) RemoveTemplate(context.Context, string) error              { return nil }
func (nopStorage) Prepare(context.Context, string, storage.Source, int64) (string, error) {
	return "", nil
}
func (nopStorage) Snapshot(context.Context, string, string, func()) (storage.SnapshotInfo, error) {
	return storage.SnapshotInfo{}, nil
}
func (nopStorage) Flush(context.Context, string) error          { return nil }
func (nopStorage) Remove(context.Context, string) error         { return nil }
func (nopStorage) Usage(context.Context, string) (int64, error) { return 0, nil }
func (nopStorage) Verify(context.Context, string) error         { return nil }
func (nopStorage) RemoveSnapshot(context.Context, string) error { return nil }
func (nopStorage) Layers(context.Context) ([]string, error)     { return nil, nil }
func (nopStorage) Snapshots(context.Context) ([]string, error)  { return nil, nil }
func (nopStorage) Close() error                                 { return nil }

// newTestManager returns a manager over a fresh store and drv, with one
// live running sandbox (no agent) that expires in an hour.
func newTestManager(t *testing.T, drv runtime.Driver) (*Manager, *Sandbox) {
	t.Helper()
	if os.Geteuid() != 0 {
		// Teardown unmounts the (absent) writable layer, which needs root.
		t.Skip("needs root")
	}
	dir := t.TempDir()
	layout, err := datadir.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := NewManager(Options{Layout: layout, Store: st, Drivers: []runtime.Driver{drv}, Storage: nopStorage{}, Limits: defaults.Limits(),
		Audit: testAudit(st, log), Log: log})
	t.Cleanup(m.Close)
	now := time.Now().UTC()
	sb := &Sandbox{id: "testsandbox000000001", killers: map[int]*time.Timer{}, feeding: map[int]chan struct{}{},
		done: make(chan struct{})}
	sb.dir = layout.Sandbox(sb.id)
	sb.rec = node.Session{ID: sb.id, Template: "base", Driver: "fake", State: node.StateRunning,
		CPU: 1, MemoryMB: 512, Pids: 512, TimeoutS: 3600, DefaultUser: "user",
		CreatedAt: now, StartedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := st.CreateSession(context.Background(), &sb.rec); err != nil {
		t.Fatal(err)
	}
	m.register(sb)
	m.arm(sb)
	return m, sb
}

// TestSetTimeoutDuringTeardown: a timeout change that races a teardown must
// neither succeed on a sandbox being torn down nor leave the stored record
// in an older state than terminated, nor re-arm the session timer. (A
// SetTimeout that passed its running check just before a teardown began
// used to write its copy of the record, "terminating", over the final
// "terminated" and arm the timer again; its last step is replayed here.)
func TestSetTimeoutDuringTeardown(t *testing.T) {
	drv := &fakeDriver{deleting: make(chan struct{}, 1), release: make(chan struct{})}
	m, sb := newTestManager(t, drv)
	ctx := context.Background()
	torn := make(chan error, 1)
	go func() { torn <- m.teardown(ctx, sb, node.ReasonDeleted, "") }()
	<-drv.deleting // the teardown is under way

	if _, err := m.SetTimeout(ctx, sb.id, 600); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("SetTimeout during teardown: %v, want a conflict", err)
	}
	close(drv.release)
	if err := <-torn; err != nil {
		t.Fatal(err)
	}
	if _, err := m.SetTimeout(ctx, sb.id, 600); !errors.Is(err, errdefs.ErrTerminated) {
		t.Fatalf("SetTimeout after teardown: %v, want terminated", err)
	}
	rec, err := m.opts.Store.GetSession(ctx, sb.id)
	if err != nil || rec.State != node.StateTerminated || rec.Reason != node.ReasonDeleted {
		t.Fatalf("stored record %+v %v, want terminated (deleted)", rec, err)
	}
	// A late arm (as SetTimeout did after its check) must not bring the
	// timer of a terminated sandbox back.
	m.arm(sb)
	sb.mu.Lock()
	stopped := sb.timer == nil || !sb.timer.Stop()
	sb.mu.Unlock()
	if !stopped {
		t.Fatal("the session timer of a terminated sandbox is armed")
	}
}

// TestTeardownWaiterSeesFailure: a second teardown (a DELETE while the timer
// tears down, say) that waits for a failing first one must fail at once,
// not wait for minutes and then report success for a sandbox still there.
func TestTeardownWaiterSeesFailure(t *testing.T) {
	drv := &fakeDriver{deleting: make(chan struct{}, 1), release: make(chan struct{}), failures: 1}
	m, sb := newTestManager(t, drv)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- m.teardown(ctx, sb, node.ReasonTimeout, "session timeout reached") }()
	<-drv.deleting
	second := make(chan error, 1)
	go func() { second <- m.Destroy(ctx, sb.id) }()
	time.Sleep(50 * time.Millisecond) // let Destroy start waiting
	close(drv.release)
	if err := <-first; err == nil {
		t.Fatal("first teardown succeeded; the fake driver should have failed it")
	}
	select {
	case err := <-second:
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("waiting Destroy: %v, want unavailable (retried later)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a Destroy waiting for a failed teardown hangs")
	}
	if got := sb.Record(); got.State != node.StateTerminating || got.Reason != node.ReasonTimeout {
		t.Fatalf("record after a failed teardown: %s (%s), want terminating (timeout)", got.State, got.Reason)
	}
	// The retry (the janitor's, here Destroy's) finishes the job.
	drv.deleting = nil
	drv.release = nil
	if err := m.Destroy(ctx, sb.id); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Get(ctx, sb.id); got.State != node.StateTerminated || got.Reason != node.ReasonTimeout {
		t.Fatalf("after retry: %s (%s), want terminated (timeout)", got.State, got.Reason)
	}
}

// snapshots returns the snapshot service over m and m's storage driver,
// as the composition (package host) wires it.
func snapshots(m *Manager) *snapshot.Service {
	s := snapshot.New(snapshot.Options{Core: heldCore{m.SnapshotCore(), m.Concerns().Commands}, Store: m.opts.Store, Storage: m.opts.Storage,
		Layout: m.opts.Layout, Log: m.log})
	m.UseSnapshots(s)
	return s
}

// heldCore is SnapshotCore with Find returning snapshot.Held (as in
// package host).
type heldCore struct {
	*SnapshotCore
	cmds *Commands
}

// Exec runs a command as the composition's snapshotCore does.
func (c heldCore) Exec(ctx context.Context, id string, spec node.ExecSpec, out node.Output) (*node.ExecResult, error) {
	return c.cmds.Exec(ctx, id, spec, out)
}

func (c heldCore) Find(ctx context.Context, id string) (snapshot.Held, error) {
	h, err := c.SnapshotCore.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// TestRemoveTemplateIfUnused: a template a live session uses is not removed.
func TestRemoveTemplateIfUnused(t *testing.T) {
	m, _ := newTestManager(t, &fakeDriver{})
	removed := false
	remove := func() error { removed = true; return nil }
	if err := m.tpls.RemoveTemplateIfUnused("base", remove); !errors.Is(err, errdefs.ErrConflict) || removed {
		t.Fatalf("remove a template in use: %v (removed %v), want conflict", err, removed)
	}
	if err := m.tpls.RemoveTemplateIfUnused("other", remove); err != nil || !removed {
		t.Fatalf("remove an unused template: %v (removed %v)", err, removed)
	}
	m.Close() // and again at cleanup: Close may be called twice
}

// holdingStorage is a nopStorage whose Snapshot waits for release, and
// whose Remove notes whether a Snapshot of the layer was still running.
type holdingStorage struct {
	nopStorage
	snapshotting chan struct{} // gets a value when Snapshot starts
	release      chan struct{} // Snapshot waits for it
	mu           sync.Mutex
	inSnapshot   bool
	removedMidst bool // Remove ran while Snapshot did
}

func (s *holdingStorage) Snapshot(ctx context.Context, id, snapID string, captured func()) (storage.SnapshotInfo, error) {
	s.mu.Lock()
	s.inSnapshot = true
	s.mu.Unlock()
	s.snapshotting <- struct{}{}
	<-s.release
	s.mu.Lock()
	s.inSnapshot = false
	s.mu.Unlock()
	return storage.SnapshotInfo{ID: snapID, Template: "base", Digest: "sha256:x", CreatedAt: time.Now()}, nil
}

func (s *holdingStorage) Remove(context.Context, string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inSnapshot {
		s.removedMidst = true
	}
	return nil
}

// TestDestroyWaitsForSnapshot: a destroy that arrives while a snapshot of
// the session is being taken waits for it, so the storage driver never
// removes the writable layer it is reading (the snapshot then failed with
// an internal error, or on overlay could copy a half-deleted tree), and
// the snapshot is kept.
func TestDestroyWaitsForSnapshot(t *testing.T) {
	m, sb := newTestManager(t, &fakeDriver{})
	st := &holdingStorage{snapshotting: make(chan struct{}, 1), release: make(chan struct{})}
	m.opts.Storage = st
	ctx := context.Background()
	snapped := make(chan error, 1)
	go func() {
		_, err := snapshots(m).Snapshot(ctx, sb.id, node.SnapshotOptions{})
		snapped <- err
	}()
	<-st.snapshotting
	destroyed := make(chan error, 1)
	go func() { destroyed <- m.Destroy(ctx, sb.id) }()
	select {
	case err := <-destroyed:
		t.Fatalf("Destroy returned (%v) while a snapshot of the session was being taken", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := snapshots(m).Snapshot(ctx, sb.id, node.SnapshotOptions{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a snapshot that starts during the teardown: %v, want conflict", err)
	}
	close(st.release)
	if err := <-snapped; err != nil {
		t.Fatalf("snapshot raced by a destroy: %v", err)
	}
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
	if st.removedMidst {
		t.Fatal("the layer was removed while it was being snapshotted")
	}
}

// capturingStorage is a nopStorage whose Snapshot reports the files
// captured and then checks whether the sandbox runs again before it goes
// on (with the digest walk, in a real driver).
type capturingStorage struct {
	nopStorage
	drv          *fakeDriver
	frozenBefore bool // the sandbox was frozen when Snapshot began
	frozenAfter  bool // ... and still frozen after captured
	flushes      int  // Flush calls
	flushFrozen  bool // the sandbox was frozen during a Flush
}

func (s *capturingStorage) Flush(ctx context.Context, id string) error {
	s.drv.mu.Lock()
	defer s.drv.mu.Unlock()
	s.flushes++
	s.flushFrozen = s.flushFrozen || s.drv.frozen
	return nil
}

func (s *capturingStorage) Snapshot(ctx context.Context, id, snapID string, captured func()) (storage.SnapshotInfo, error) {
	s.drv.mu.Lock()
	s.frozenBefore = s.drv.frozen
	s.drv.mu.Unlock()
	captured()
	s.drv.mu.Lock()
	s.frozenAfter = s.drv.frozen
	s.drv.mu.Unlock()
	return storage.SnapshotInfo{ID: snapID, Template: "base", Digest: "sha256:x", CreatedAt: time.Now()}, nil
}

// TestSnapshotThawsWhenCaptured: a running session is frozen for the
// capture only, not for what the driver does after it (digesting every
// file took seconds for a sandbox with 200,000 files, all of them frozen),
// and thawed exactly once.
func TestSnapshotThawsWhenCaptured(t *testing.T) {
	drv := &fakeDriver{}
	m, sb := newTestManager(t, drv)
	st := &capturingStorage{drv: drv}
	m.opts.Storage = st
	if _, err := snapshots(m).Snapshot(context.Background(), sb.id, node.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if !st.frozenBefore || st.frozenAfter {
		t.Fatalf("frozen when the snapshot began: %v, after the capture: %v; want true, false", st.frozenBefore, st.frozenAfter)
	}
	if drv.frozen || drv.resumes != 1 {
		t.Fatalf("after the snapshot: frozen %v, %d resumes; want thawed once", drv.frozen, drv.resumes)
	}
}

// TestSnapshotFlushesBeforeFreezing: the layer's pending writes are
// flushed once, while the sandbox still runs, before the freeze (a
// snapshot after a 300 MB unsynced write froze the sandbox for 587 ms
// while the snapshot ioctl wrote them).
func TestSnapshotFlushesBeforeFreezing(t *testing.T) {
	drv := &fakeDriver{}
	m, sb := newTestManager(t, drv)
	st := &capturingStorage{drv: drv}
	m.opts.Storage = st
	if _, err := snapshots(m).Snapshot(context.Background(), sb.id, node.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if st.flushes != 1 || st.flushFrozen || !st.frozenBefore {
		t.Fatalf("%d flushes, frozen during one: %v, frozen at the capture: %v; want one flush of the running sandbox, then the freeze",
			st.flushes, st.flushFrozen, st.frozenBefore)
	}
}

// TestCloseWaitsForPoolFill: Close waits for a warm-pool member that is
// being made (it used to return while the member's create still ran, and
// the daemon then closed the storage driver and the database under it).
func TestCloseWaitsForPoolFill(t *testing.T) {
	drv := &fakeDriver{creating: make(chan struct{}, 1), createRelease: make(chan struct{})}
	m, _ := newTestManager(t, drv)
	if _, err := storage.BuildBase(m.opts.Layout.Template(storage.BaseTemplate), storage.DefaultIDShift); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pools := pool.New(pool.Options{Core: m.PoolCore(), Store: m.opts.Store, Log: m.log})
	m.UseWarmPools(pools)
	if err := pools.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.SetPool(ctx, node.Pool{Template: storage.BaseTemplate, Size: 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-drv.creating:
	case <-time.After(30 * time.Second):
		t.Fatal("the pool never started a member")
	}
	closed := make(chan struct{})
	go func() { pools.Close(); m.Close(); close(closed) }() // as host.Node.Close
	select {
	case <-closed:
		t.Fatal("Close returned while a pool member was being created")
	case <-time.After(200 * time.Millisecond):
	}
	close(drv.createRelease)
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return after the member's create ended")
	}
}

// TestStaleTimeoutCallback: a timer callback that fired just before a
// SetTimeout saved (Timer.Stop cannot recall it) must not end or pause the
// session whose timeout was moved.
func TestStaleTimeoutCallback(t *testing.T) {
	m, sb := newTestManager(t, &fakeDriver{})
	ctx := context.Background()
	if _, err := m.SetTimeout(ctx, sb.id, 60); err != nil {
		t.Fatal(err)
	}
	// What the stale callback does after its first check passed.
	if err := m.teardownIf(ctx, sb, node.ReasonTimeout, "session timeout reached", timeoutDue); !errors.Is(err, errNotDue) {
		t.Fatalf("teardown of a session whose timeout moved: %v, want errNotDue", err)
	}
	if _, err := m.pause(ctx, sb.id, pauseTimeout); !errors.Is(err, errNotDue) {
		t.Fatalf("pause on a timeout that moved: %v, want errNotDue", err)
	}
	if got := sb.Record(); got.State != node.StateRunning {
		t.Fatalf("state %s after stale timeout actions, want running", got.State)
	}
	// Once due, the same calls act.
	if _, err := m.save(ctx, sb, func(r *node.Session) error { r.ExpiresAt = time.Now().Add(-time.Second); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := m.teardownIf(ctx, sb, node.ReasonTimeout, "session timeout reached", timeoutDue); err != nil {
		t.Fatal(err)
	}
	if got := sb.Record(); got.State != node.StateTerminated {
		t.Fatalf("state %s after a due timeout, want terminated", got.State)
	}
}
