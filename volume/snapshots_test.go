package volume

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// volumeFile returns the path of file rel in tenant's volume name.
func volumeFile(t *testing.T, s *Service, tenant, name, rel string) string {
	t.Helper()
	r, err := s.store.GetVolume(context.Background(), tenant, name)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(s.layerPath(r.LayerID), rel)
}

// TestSnapshotAndCreateFrom: a volume's snapshot holds its files as they
// were; a volume made from it starts with them, is written independently
// of the source, keeps the source's size unless given one, outlives the
// source's removal, and is another tenant's to see by neither id nor name.
func TestSnapshotAndCreateFrom(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	if _, err := s.Create(ctx, "t1", "src", 6, ""); err != nil {
		t.Fatal(err)
	}
	f := volumeFile(t, s, "t1", "src", "note")
	if err := os.WriteFile(f, []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	sn, err := s.Snapshot(ctx, "t1", "src", "first")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Volume != "src" || sn.SizeMB != 6 || sn.Name != "first" {
		t.Fatalf("snapshot %+v", sn)
	}
	if _, err := s.Snapshot(ctx, "t1", "src", "first"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second snapshot named first: %v", err)
	}
	if err := os.WriteFile(f, []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := s.Create(ctx, "t1", "copy", 0, "first")
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeMB != 6 {
		t.Fatalf("copy size %d, want the source's 6", v.SizeMB)
	}
	cf := volumeFile(t, s, "t1", "copy", "note")
	if b, _ := os.ReadFile(cf); string(b) != "before" {
		t.Fatalf("copy holds %q, want the snapshot's", b)
	}
	if err := os.WriteFile(cf, []byte("copy's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f); string(b) != "after" {
		t.Fatalf("source holds %q after a write to the copy", b)
	}
	// Another tenant: not by name, not by id.
	if _, err := s.Create(ctx, "t2", "mine", 0, "first"); errdefs.Field(err) != "from" {
		t.Fatalf("another tenant's create from the snapshot's name: %v", err)
	}
	if _, err := s.Create(ctx, "t2", "mine", 0, sn.ID); errdefs.Field(err) != "from" {
		t.Fatalf("another tenant's create from the snapshot's id: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, "t2", "src", sn.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's delete: %v", err)
	}
	if _, err := s.ListSnapshots(ctx, "t2", "src"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's list: %v", err)
	}
	// The snapshot outlives its volume and still makes volumes.
	if err := s.Remove(ctx, "t1", "src"); err != nil {
		t.Fatal(err)
	}
	if l, err := s.ListSnapshots(ctx, "t1", "src"); err != nil || len(l) != 1 || l[0].ID != sn.ID {
		t.Fatalf("snapshots of a removed volume: %+v %v", l, err)
	}
	if _, err := s.Create(ctx, "t1", "again", 9, sn.ID); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(volumeFile(t, s, "t1", "again", "note")); string(b) != "before" {
		t.Fatalf("volume from the snapshot after its source went holds %q", b)
	}
	if !s.OwnsSnapshot(ctx, storageSnapshot(sn.ID)) || s.OwnsSnapshot(ctx, storageSnapshot(node.NewID())) {
		t.Fatal("OwnsSnapshot does not tell a recorded volume snapshot from an unknown one")
	}
	if err := s.DeleteSnapshot(ctx, "t1", "src", "first"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(cf); string(b) != "copy's" {
		t.Fatalf("copy after its snapshot went holds %q", b)
	}
	if s.OwnsSnapshot(ctx, storageSnapshot(sn.ID)) {
		t.Fatal("a deleted volume snapshot is still owned")
	}
}

// TestCaptureCopies: a session snapshot's capture records each mount; a
// session restored from it gets a copy of each read-write volume as
// captured (its own, named after it, with the volume's quota), its
// read-only mounts as they were; DropCopies removes the copies and
// DropSessionSnapshot the capture.
func TestCaptureCopies(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	for _, n := range []string{"rw", "shared"} {
		if _, err := s.Create(ctx, "t1", n, 5, ""); err != nil {
			t.Fatal(err)
		}
	}
	f := volumeFile(t, s, "t1", "rw", "state")
	if err := os.WriteFile(f, []byte("at snapshot"), 0o644); err != nil {
		t.Fatal(err)
	}
	ms := []node.VolumeMount{{Name: "rw", Path: "/home/user/rw"}, {Name: "shared", Path: "/mnt/shared", ReadOnly: true}}
	snapID := node.NewID()
	c, err := s.BeginCapture(ctx, "t1", snapID, ms)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte("later"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.SnapshotMounts(ctx, snapID)
	if err != nil || len(got) != 2 || got[0].Snapshot == "" || got[1].Snapshot != "" || !got[1].ReadOnly || got[1].Name != "shared" {
		t.Fatalf("snapshot mounts %+v %v", got, err)
	}
	// Not a volume's own snapshot: not listed, not a create's from.
	if l, _ := s.ListSnapshots(ctx, "t1", "rw"); len(l) != 0 {
		t.Fatalf("a session snapshot's volume snapshot is listed as the volume's: %+v", l)
	}
	child := node.NewID()
	m, err := s.CopyForSession(ctx, "t1", child, got[0])
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "rw-"+child || m.Snapshot != "" || m.Path != "/home/user/rw" {
		t.Fatalf("copy mount %+v", m)
	}
	v, err := s.Get(ctx, "t1", m.Name)
	if err != nil || v.Session != child || v.SizeMB != 5 {
		t.Fatalf("copy %+v %v", v, err)
	}
	if b, _ := os.ReadFile(volumeFile(t, s, "t1", m.Name, "state")); string(b) != "at snapshot" {
		t.Fatalf("copy holds %q", b)
	}
	if _, err := s.CopyForSession(ctx, "t2", node.NewID(), got[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's copy: %v", err)
	}
	s.DropCopies(ctx, child, slog.Default())
	if _, err := s.Get(ctx, "t1", m.Name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("copy after its session ended: %v", err)
	}
	if err := s.DropSessionSnapshot(ctx, snapID); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.SnapshotMounts(ctx, snapID); len(l) != 0 {
		t.Fatalf("mounts after the session snapshot went: %+v", l)
	}
	if s.OwnsSnapshot(ctx, storageSnapshot(got[0].Snapshot)) {
		t.Fatal("the capture's storage snapshot is still owned")
	}
}
