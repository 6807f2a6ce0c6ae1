package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// walks returns how many entries f made the process's manifest walks read.
func walks(f func()) int64 {
	before := storage.DigestedEntries()
	f()
	return storage.DigestedEntries() - before
}

// TestVerifyReusesStampedDigest: a Verify right after Snapshot, and every
// later one, reads no entry (the stamp holds); a tampered snapshot is
// walked again and refused even before the change is committed; a
// snapshot whose metadata has no stamp (written by an older forkbox) is
// walked once, then stamped; another subvolume put under the snapshot's
// name is walked.
func TestVerifyReusesStampedDigest(t *testing.T) {
	d, _ := newWithTemplate(t)
	ctx := context.Background()
	rootfs, err := d.Prepare(ctx, "l", storage.Source{Template: "t"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		if err := os.WriteFile(filepath.Join(rootfs, "tmp", fmt.Sprint("f", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var info storage.SnapshotInfo
	if n := walks(func() { info, err = d.Snapshot(ctx, "l", "s1", nil) }); err != nil || n < 200 {
		t.Fatalf("Snapshot: %v, %d entries walked", err, n)
	}
	for i := 0; i < 3; i++ {
		if n := walks(func() { err = d.Verify(ctx, info.ID) }); err != nil || n != 0 {
			t.Fatalf("Verify #%d of an untouched snapshot: %v, %d entries walked, want none", i+1, err, n)
		}
	}

	// An older forkbox's metadata: no stamp. One walk, then none.
	var m snapMeta
	if err := storage.ReadJSON(d.snapPath("s1")+".json", &m, "s1"); err != nil || m.Verified == nil || m.Entries < 200 {
		t.Fatalf("metadata %+v (%v), want a stamp and the entry count", m, err)
	}
	m.Verified, m.Entries = nil, 0
	if err := storage.WriteJSON(d.snapPath("s1")+".json", &m, 0o600); err != nil {
		t.Fatal(err)
	}
	if n := walks(func() { err = d.Verify(ctx, "s1") }); err != nil || n < 200 {
		t.Fatalf("Verify without a stamp: %v, %d entries walked, want a walk", err, n)
	}
	if n := walks(func() { err = d.Verify(ctx, "s1") }); err != nil || n != 0 {
		t.Fatalf("Verify after the stamp was recorded: %v, %d entries walked", err, n)
	}

	// Tampering (without any sync: the change is not committed yet).
	tamper(t, d, "s1")
	if n := walks(func() { err = d.Verify(ctx, "s1") }); !errors.Is(err, errdefs.ErrConflict) || n == 0 {
		t.Fatalf("Verify after tampering: %v (%d entries walked), want an integrity failure after a walk", err, n)
	}
	if err := d.Verify(ctx, "s1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second Verify after tampering: %v", err)
	}

	// Another subvolume under a stamped snapshot's name.
	if _, err := d.Snapshot(ctx, "l", "s2", nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Verify(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	if err := d.destroy(d.snapshotsDir(), "s2"); err != nil {
		t.Fatal(err)
	}
	if err := snapshotInto(rootfs, d.snapshotsDir(), "s2", true); err != nil {
		t.Fatal(err)
	}
	if n := walks(func() { err = d.Verify(ctx, "s2") }); n == 0 {
		t.Fatalf("Verify of a replaced subvolume walked nothing (%v)", err)
	}
}

// TestSnapshotEntryLimit: a snapshot of a layer holding more entries than
// the driver's bound fails with a resource-exhausted error naming it,
// and leaves no snapshot behind.
func TestSnapshotEntryLimit(t *testing.T) {
	needBtrfs(t)
	base := testDir(t)
	d, err := New(context.Background(), Options{Dir: filepath.Join(base, "fs"), ImageBytes: testImageBytes,
		Shift: storage.DefaultIDShift, MaxSnapshotEntries: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); unmount(t, filepath.Join(base, "fs")) })
	rootfs := filepath.Join(base, "rootfs")
	makeRootfs(t, rootfs)
	ctx := context.Background()
	if err := d.AddTemplate(ctx, "t", rootfs, "v1"); err != nil {
		t.Fatal(err)
	}
	layer, err := d.Prepare(ctx, "l", storage.Source{Template: "t"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Snapshot(ctx, "l", "ok", nil); err != nil {
		t.Fatalf("a small snapshot under the bound: %v", err)
	}
	for i := 0; i < 100; i++ {
		os.WriteFile(filepath.Join(layer, "tmp", fmt.Sprint(i)), nil, 0o644)
	}
	_, err = d.Snapshot(ctx, "l", "big", nil)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "more than 100 entries") {
		t.Fatalf("a snapshot over the bound: %v, want resource exhausted naming 100", err)
	}
	if ids, _ := d.Snapshots(ctx); contains(ids, "big") {
		t.Fatal("the refused snapshot is left")
	}
	if _, err := os.Lstat(d.snapPath("big")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused snapshot's subvolume is left: %v", err)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
