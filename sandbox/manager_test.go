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

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
)

// fakeDriver is a runtime.Driver whose Delete can be held and made to fail.
type fakeDriver struct {
	mu       sync.Mutex
	deleting chan struct{} // gets a value when Delete starts
	release  chan struct{} // Delete waits for it (when not nil)
	failures int           // Delete fails this many more times
}

func (d *fakeDriver) Name() string                                 { return "fake" }
func (d *fakeDriver) Capabilities() runtime.Capabilities           { return runtime.Capabilities{} }
func (d *fakeDriver) Create(context.Context, runtime.Config) error { return nil }
func (d *fakeDriver) List(context.Context) ([]string, error)       { return nil, nil }
func (d *fakeDriver) Pause(context.Context, string) error          { return nil }
func (d *fakeDriver) Resume(context.Context, string) error         { return nil }
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
func (nopStorage) Snapshot(context.Context, string, string) (storage.SnapshotInfo, error) {
	return storage.SnapshotInfo{}, nil
}
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
	layout, err := storage.NewLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := NewManager(Options{Layout: layout, Store: st, Driver: drv, Storage: nopStorage{}, Limits: DefaultLimits(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(m.Close)
	now := time.Now().UTC()
	sb := &Sandbox{id: "testsandbox000000001", killers: map[int]*time.Timer{}, feeding: map[int]chan struct{}{},
		done: make(chan struct{})}
	sb.dir = layout.Sandbox(sb.id)
	sb.rec = store.Session{ID: sb.id, Template: "base", Driver: "fake", State: store.StateRunning,
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
	go func() { torn <- m.teardown(ctx, sb, store.ReasonDeleted, "") }()
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
	if err != nil || rec.State != store.StateTerminated || rec.Reason != store.ReasonDeleted {
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
	go func() { first <- m.teardown(ctx, sb, store.ReasonTimeout, "session timeout reached") }()
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
	if got := sb.Record(); got.State != store.StateTerminating || got.Reason != store.ReasonTimeout {
		t.Fatalf("record after a failed teardown: %s (%s), want terminating (timeout)", got.State, got.Reason)
	}
	// The retry (the janitor's, here Destroy's) finishes the job.
	drv.deleting = nil
	drv.release = nil
	if err := m.Destroy(ctx, sb.id); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Get(ctx, sb.id); got.State != store.StateTerminated || got.Reason != store.ReasonTimeout {
		t.Fatalf("after retry: %s (%s), want terminated (timeout)", got.State, got.Reason)
	}
}

// TestRemoveTemplateIfUnused: a template a live session uses is not removed.
func TestRemoveTemplateIfUnused(t *testing.T) {
	m, _ := newTestManager(t, &fakeDriver{})
	removed := false
	remove := func() error { removed = true; return nil }
	if err := m.RemoveTemplateIfUnused("base", remove); !errors.Is(err, errdefs.ErrConflict) || removed {
		t.Fatalf("remove a template in use: %v (removed %v), want conflict", err, removed)
	}
	if err := m.RemoveTemplateIfUnused("other", remove); err != nil || !removed {
		t.Fatalf("remove an unused template: %v (removed %v)", err, removed)
	}
	m.Close() // and again at cleanup: Close may be called twice
}
