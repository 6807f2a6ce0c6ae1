package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/tenancy"
)

// chain makes s1 (of a layer from the template) and s2 (of a session
// restored from s1), so s2 has s1 as parent, both of tenant "acme".
func chain(t *testing.T, e *env) (s1, s2 *node.Snapshot) {
	t.Helper()
	a := node.NewID()
	e.layer(t, a, storage.Source{Template: testTemplate}, "one", "1")
	s1 = e.snap(t, a, "acme", nil)
	b, err := e.core.CreateVerified(context.Background(), node.CreateSpec{Snapshot: s1.ID})
	if err != nil {
		t.Fatal(err)
	}
	s2 = e.snap(t, b.ID, "acme", nil)
	if s2.Parent != s1.ID || s1.Parent != "" {
		t.Fatalf("parents: s1 %q, s2 %q; want none and %s", s1.Parent, s2.Parent, s1.ID)
	}
	return s1, s2
}

// TestDeleteRules: a snapshot with a child snapshot or a live session is
// not deleted (the conflict names them); force destroys the sessions and
// deletes the children first; another tenant's snapshot reads as unknown.
func TestDeleteRules(t *testing.T) {
	e := newEnv(t)
	s1, s2 := chain(t, e)
	acme := tenancy.With(context.Background(), tenancy.Caller{Tenant: "acme"})
	other := tenancy.With(context.Background(), tenancy.Caller{Tenant: "other"})
	sessions, err := e.s.Fork(acme, s2.ID, 2, node.CreateSpec{})
	if err != nil {
		t.Fatal(err)
	}

	err = e.s.DeleteSnapshot(acme, s1.ID, false)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "snapshots "+s2.ID) {
		t.Fatalf("delete a parent: %v, want a conflict naming child %s", err, s2.ID)
	}
	err = e.s.DeleteSnapshot(acme, s2.ID, false)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), sessions[0].ID) || !strings.Contains(err.Error(), sessions[1].ID) {
		t.Fatalf("delete a snapshot sessions run on: %v, want a conflict naming them", err)
	}
	if err := e.s.DeleteSnapshot(other, s1.ID, true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's forced delete: %v, want not found", err)
	}
	if recs, files := e.stored(t, s1.ID, s2.ID); len(recs) != 2 || len(files) != 2 {
		t.Fatalf("after refused deletes: records %v, files %v; want both kept", recs, files)
	}

	if err := e.s.DeleteSnapshot(acme, s1.ID, true); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
	if recs, files := e.stored(t, s1.ID, s2.ID); len(recs)+len(files) != 0 {
		t.Fatalf("after a forced delete: records %v, files %v; want none", recs, files)
	}
	for _, se := range sessions {
		rec, err := e.st.GetSession(context.Background(), se.ID)
		if err != nil || rec.State != node.StateTerminated {
			t.Fatalf("session %s on the deleted chain: %+v (%v), want terminated", se.ID, rec, err)
		}
	}
	if err := e.s.DeleteSnapshot(acme, s1.ID, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete again: %v, want not found", err)
	}
}

// TestForkAllOrNothing: a fork whose last session fails destroys the ones
// it made; a fork that succeeds leaves its sessions on the snapshot.
func TestForkAllOrNothing(t *testing.T) {
	e := newEnv(t)
	_, s2 := chain(t, e)
	ctx := context.Background()
	e.core.mu.Lock()
	e.core.n, e.core.limit = 0, 3
	e.core.mu.Unlock()
	if _, err := e.s.Fork(ctx, s2.ID, 3, node.CreateSpec{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("fork past the host's limit: %v, want unavailable", err)
	}
	_, users, err := e.st.SnapshotDependents(ctx, s2.ID)
	if err != nil || len(users) != 0 {
		t.Fatalf("sessions left on the snapshot after a failed fork: %v (%v), want none", users, err)
	}
	for _, bad := range []struct {
		count int
		spec  node.CreateSpec
		field string
	}{{0, node.CreateSpec{}, "count"}, {MaxForks + 1, node.CreateSpec{}, "count"}, {1, node.CreateSpec{Template: testTemplate}, "template"}} {
		if _, err := e.s.Fork(ctx, s2.ID, bad.count, bad.spec); errdefs.Field(err) != bad.field {
			t.Fatalf("Fork(%d, %+v) = %v, want an invalid %s", bad.count, bad.spec, err, bad.field)
		}
	}
	e.core.mu.Lock()
	e.core.limit = 0
	e.core.mu.Unlock()
	got, err := e.s.Fork(ctx, s2.ID, 2, node.CreateSpec{})
	if err != nil || len(got) != 2 {
		t.Fatalf("Fork = %v, %v", got, err)
	}
	if _, users, _ := e.st.SnapshotDependents(ctx, s2.ID); len(users) != 2 {
		t.Fatalf("%d sessions on the snapshot, want 2", len(users))
	}
}

// TestCollectExpired: an expired snapshot nothing uses is deleted, one
// still used waits until it is not, an unexpired one stays.
func TestCollectExpired(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	past := func(sn *node.Snapshot) { sn.ExpiresAt = time.Now().Add(-time.Minute) }
	a, b, c := node.NewID(), node.NewID(), node.NewID()
	e.layer(t, a, storage.Source{Template: testTemplate}, "f", "a")
	e.layer(t, b, storage.Source{Template: testTemplate}, "f", "b")
	e.layer(t, c, storage.Source{Template: testTemplate}, "f", "c")
	unused := e.snap(t, a, "acme", past)
	used := e.snap(t, b, "acme", past)
	fresh := e.snap(t, c, "acme", func(sn *node.Snapshot) { sn.ExpiresAt = time.Now().Add(time.Hour) })
	forks, err := e.s.Fork(ctx, used.ID, 1, node.CreateSpec{})
	if err != nil {
		t.Fatal(err)
	}
	e.s.CollectExpired(ctx)
	recs, files := e.stored(t, unused.ID, used.ID, fresh.ID)
	if recs[unused.ID] || files[unused.ID] || !recs[used.ID] || !files[used.ID] || !recs[fresh.ID] {
		t.Fatalf("after a collection: records %v, files %v; want the unused expired one gone, the others kept", recs, files)
	}
	if err := e.core.Destroy(ctx, forks[0].ID); err != nil {
		t.Fatal(err)
	}
	e.s.CollectExpired(ctx)
	if recs, _ := e.stored(t, used.ID, fresh.ID); recs[used.ID] || !recs[fresh.ID] {
		t.Fatalf("after its session ended: records %v; want the expired one gone, the fresh one kept", recs)
	}
}

// TestReconcile: at start-up, snapshot files and sealed checkpoints the
// database does not know are removed; an interrupted fork's snapshot that
// nothing uses is deleted, one its adopted forks use expires now (and is
// collected once they end); a finished fork's snapshot stays as it was.
func TestReconcile(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, b, c, d, u := node.NewID(), node.NewID(), node.NewID(), node.NewID(), node.NewID()
	for _, id := range []string{a, b, c, d, u} {
		e.layer(t, id, storage.Source{Template: testTemplate}, "f", id)
	}
	provisional := func(sn *node.Snapshot) { sn.Provisional = true }
	lonely := e.snap(t, a, "acme", provisional)
	adopted := e.snap(t, b, "acme", provisional)
	kept := e.snap(t, c, "acme", nil)
	// A memory snapshot answered and never sealed (the daemon died while
	// sealing it): no digest, no seal under way.
	unsealed := e.snap(t, u, "acme", func(sn *node.Snapshot) { sn.MemoryDriver, sn.MemoryBytes = "gvisor", 100 })
	forks, err := e.s.Fork(ctx, adopted.ID, 1, node.CreateSpec{})
	if err != nil {
		t.Fatal(err)
	}
	// Left by a crash: a snapshot the driver has and the database does
	// not, and sealed checkpoints of a missing and of a known snapshot.
	orphan := node.NewID()
	if _, err := e.drv.Snapshot(ctx, d, orphan, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{orphan, kept.ID} {
		if err := os.MkdirAll(e.s.memoryDir(id), 0o700); err != nil {
			t.Fatal(err)
		}
	}

	e.s.Reconcile(ctx)
	recs, files := e.stored(t, lonely.ID, adopted.ID, kept.ID, orphan, unsealed.ID)
	if recs[lonely.ID] || files[lonely.ID] || files[orphan] || !recs[adopted.ID] || !recs[kept.ID] || !files[kept.ID] {
		t.Fatalf("after Reconcile: records %v, files %v; want the unused interrupted fork's and the orphan gone", recs, files)
	}
	if recs[unsealed.ID] || files[unsealed.ID] {
		t.Fatalf("after Reconcile: records %v, files %v; want the never-sealed memory snapshot gone", recs, files)
	}
	if _, err := os.Stat(e.s.memoryDir(orphan)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("orphaned sealed checkpoint: %v, want removed", err)
	}
	if _, err := os.Stat(e.s.memoryDir(kept.ID)); err != nil {
		t.Fatalf("a known snapshot's checkpoint: %v, want kept", err)
	}
	got, err := e.st.GetSnapshot(ctx, adopted.ID)
	if err != nil || got.ExpiresAt.IsZero() || got.ExpiresAt.After(time.Now()) {
		t.Fatalf("interrupted fork's snapshot its forks use: %+v (%v), want it expiring now", got, err)
	}
	if k, _ := e.st.GetSnapshot(ctx, kept.ID); !k.ExpiresAt.IsZero() {
		t.Fatalf("a finished snapshot was given an expiry: %v", k.ExpiresAt)
	}
	if err := e.core.Destroy(ctx, forks[0].ID); err != nil {
		t.Fatal(err)
	}
	e.s.CollectExpired(ctx)
	if recs, _ := e.stored(t, adopted.ID); recs[adopted.ID] {
		t.Fatal("the interrupted fork's snapshot stayed after its forks ended")
	}
}

// TestResolve: a snapshot is found by id or by name (the newest with it),
// and only by its tenant; refs of neither shape are unknown.
func TestResolve(t *testing.T) {
	e := newEnv(t)
	a, b := node.NewID(), node.NewID()
	e.layer(t, a, storage.Source{Template: testTemplate}, "f", "a")
	e.layer(t, b, storage.Source{Template: testTemplate}, "f", "b")
	named := func(at time.Time) func(*node.Snapshot) {
		return func(sn *node.Snapshot) { sn.Name, sn.CreatedAt = "team/app:v1", at }
	}
	older := e.snap(t, a, "acme", named(time.Now().Add(-time.Hour).UTC()))
	newer := e.snap(t, b, "acme", named(time.Now().UTC()))
	acme := tenancy.With(context.Background(), tenancy.Caller{Tenant: "acme"})
	other := tenancy.With(context.Background(), tenancy.Caller{Tenant: "other"})
	if sn, err := e.s.GetSnapshot(acme, older.ID); err != nil || sn.ID != older.ID {
		t.Fatalf("by id: %v, %v", sn, err)
	}
	if sn, err := e.s.GetSnapshot(acme, "team/app:v1"); err != nil || sn.ID != newer.ID {
		t.Fatalf("by name: %v, %v; want the newest, %s", sn, err, newer.ID)
	}
	for _, ref := range []string{older.ID, "team/app:v1"} {
		if _, err := e.s.GetSnapshot(other, ref); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("another tenant resolves %q: %v, want not found", ref, err)
		}
	}
	for _, ref := range []string{"", "has space", strings.Repeat("x", node.MaxSnapshotName+1)} {
		if _, err := e.s.Resolve(acme, ref); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("Resolve(%q): %v, want not found", ref, err)
		}
	}
	if list, err := e.s.ListSnapshots(other); err != nil || len(list) != 0 {
		t.Fatalf("another tenant lists %v (%v), want none", list, err)
	}
	if list, err := e.s.ListSnapshots(acme); err != nil || len(list) != 2 {
		t.Fatalf("acme lists %v (%v), want 2", list, err)
	}
}

// TestOpenMemory: a sealed checkpoint is decrypted once for the restores
// of a fork and, with no decrypted images kept (TestImageCache covers
// keeping them), removed when the last one is done; a tampered one is
// refused (ErrConflict) and leaves no plaintext.
func TestOpenMemory(t *testing.T) {
	e := newEnv(t)
	e.s.cacheBytes = 0
	id := node.NewID()
	plain := filepath.Join(t.TempDir(), "checkpoint")
	if err := os.MkdirAll(plain, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(plain, "pages.img"), []byte(strings.Repeat("memory", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	sn := &node.Snapshot{ID: id, MemoryDriver: "gvisor"}
	if err := e.s.sealMemory(&memoryCapture{driver: "gvisor", dir: plain}, sn, ""); err != nil {
		t.Fatal(err)
	}
	if sn.MemoryDigest == "" || sn.MemoryBytes != 6000 {
		t.Fatalf("after sealing: record %+v; want the digest and size recorded", sn)
	}
	dir1, gen, release1, err := e.s.OpenMemory(sn)
	if err != nil {
		t.Fatal(err)
	}
	dir2, _, release2, err := e.s.OpenMemory(sn)
	if err != nil {
		t.Fatal(err)
	}
	if dir1 != dir2 || gen != Generation(id) || gen == 0 {
		t.Fatalf("two restores got %s and %s (generation %d), want one image, generation %d", dir1, dir2, gen, Generation(id))
	}
	data, err := os.ReadFile(filepath.Join(dir1, "pages.img"))
	if err != nil || string(data) != strings.Repeat("memory", 1000) {
		t.Fatalf("decrypted checkpoint: %d bytes (%v)", len(data), err)
	}
	release1()
	if _, err := os.Stat(dir1); err != nil {
		t.Fatalf("image removed while a restore still uses it: %v", err)
	}
	release2()
	if _, err := os.Stat(dir1); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image after the last restore: %v, want removed", err)
	}

	// Tamper with the sealed data: the restore is refused.
	entries, err := os.ReadDir(e.s.memoryDir(id))
	if err != nil || len(entries) == 0 {
		t.Fatalf("sealed checkpoint: %v %v", entries, err)
	}
	for _, ent := range entries {
		p := filepath.Join(e.s.memoryDir(id), ent.Name())
		if b, err := os.ReadFile(p); err == nil && len(b) > 64 {
			b[len(b)/2] ^= 1
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if _, _, _, err := e.s.OpenMemory(sn); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("open a tampered checkpoint: %v, want conflict", err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.layout.Scratch(), "restore-"+id+"-*")); len(left) != 0 {
		t.Fatalf("plaintext left after a refused restore: %v", left)
	}
}
