package volume

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// captureOf takes a session snapshot capture of mounts ms of tenant t1
// and returns the mounts a session restored from it gets.
func captureOf(t *testing.T, s *Service, ms []node.VolumeMount) []node.VolumeMount {
	t.Helper()
	ctx := context.Background()
	snapID := node.NewID()
	c, err := s.BeginCapture(ctx, "t1", snapID, ms)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.SnapshotMounts(ctx, snapID)
	if err != nil || len(got) != len(ms) {
		t.Fatalf("snapshot mounts %+v %v", got, err)
	}
	return got
}

// TestCopyMountedOnlyByItsSession: a session's copy of a snapshot's
// volume is mounted by that session alone. Another session mounting it
// (read-only passes the one-writer rule) would keep it from being removed
// when its session ends, so the copy would outlive its session (and count
// against max_volumes) until the next daemon start.
func TestCopyMountedOnlyByItsSession(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	if _, err := s.Create(ctx, "t1", "rw", 5, ""); err != nil {
		t.Fatal(err)
	}
	got := captureOf(t, s, []node.VolumeMount{{Name: "rw", Path: "/home/user/rw"}})
	child := node.NewID()
	m, err := s.CopyForSession(ctx, "t1", child, got[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Attach(ctx, "t1", child, []node.VolumeMount{m}); err != nil {
		t.Fatalf("the copy's own session: %v", err)
	}
	other := node.NewID()
	_, err = s.Attach(ctx, "t1", other, []node.VolumeMount{{Name: m.Name, Path: "/mnt/peek", ReadOnly: true}})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("another session's read-only mount of the copy: %v, want a conflict", err)
	}
	s.Release(child)
	s.DropCopies(ctx, child, slog.Default())
	if _, err := s.Get(ctx, "t1", m.Name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("copy after its session ended: %v", err)
	}
	s.Release(other)
}

// TestCopyNamesOfLongVolumes: two read-write volumes whose names share
// the part kept when a copy's name is shortened still get copies of
// distinct names, so a session restored from the snapshot starts.
func TestCopyNamesOfLongVolumes(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	long := strings.Repeat("d", 50)
	var ms []node.VolumeMount
	for i, n := range []string{long + "1", long + "2"} {
		if _, err := s.Create(ctx, "t1", n, 5, ""); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, node.VolumeMount{Name: n, Path: "/mnt/v" + string(rune('a'+i))})
	}
	got := captureOf(t, s, ms)
	child := node.NewID()
	names := map[string]bool{}
	for _, g := range got {
		m, err := s.CopyForSession(ctx, "t1", child, g)
		if err != nil {
			t.Fatalf("copy of %s: %v", g.Name, err)
		}
		if err := ValidName("name", m.Name); err != nil || !strings.HasSuffix(m.Name, "-"+child) || names[m.Name] {
			t.Fatalf("copy name %q (%v; names so far %v)", m.Name, err, names)
		}
		names[m.Name] = true
	}
	s.DropCopies(ctx, child, slog.Default())
	if vs, _ := s.List(ctx, "t1"); len(vs) != 2 {
		t.Fatalf("volumes after the copies went: %+v", vs)
	}
}

// TestCopyAfterItsVolumeWent: a session snapshot's volume outlives the
// volume: once the volume is removed, a session restored from the
// snapshot still gets a copy holding the files as captured.
func TestCopyAfterItsVolumeWent(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	if _, err := s.Create(ctx, "t1", "gone", 5, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(volumeFile(t, s, "t1", "gone", "f"), []byte("captured"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := captureOf(t, s, []node.VolumeMount{{Name: "gone", Path: "/mnt/g"}})
	if err := s.Remove(ctx, "t1", "gone"); err != nil {
		t.Fatal(err)
	}
	child := node.NewID()
	m, err := s.CopyForSession(ctx, "t1", child, got[0])
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(volumeFile(t, s, "t1", m.Name, "f")); string(b) != "captured" {
		t.Fatalf("copy of a removed volume holds %q", b)
	}
	s.DropCopies(ctx, child, slog.Default())
	if vs, _ := s.List(ctx, "t1"); len(vs) != 0 {
		t.Fatalf("volumes left: %+v", vs)
	}
}
