package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// TestChain25 restores, writes and snapshots 25 generations with long
// snapshot ids (the lower layers' paths add up to well over a page) and
// checks the last restore sees every generation, with the new mount API
// and with mount(2).
func TestChain25(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			d, _ := newDriver(t)
			forceLegacyMount = legacy
			defer func() { forceLegacyMount = false }()
			ctx := context.Background()
			const depth = 25
			from := storage.Source{Template: "t1"}
			total := 0
			for i := 0; i < depth; i++ {
				id := fmt.Sprintf("gen%02d", i)
				rootfs := prepare(t, d, id, from, 0)
				mustWrite(t, filepath.Join(rootfs, fmt.Sprintf("home/user/gen-%02d", i)), id)
				if i > 0 {
					// Delete what the previous generation wrote; the next
					// generation brings it back.
					prev := filepath.Join(rootfs, fmt.Sprintf("home/user/gen-%02d", i-1))
					if err := os.Remove(prev); err != nil {
						t.Fatal(err)
					}
					mustWrite(t, prev, "again")
				}
				snapID := fmt.Sprintf("snapshot-%02d-%s", i, strings.Repeat("x", 100))
				total += len(d.snapLayer(snapID)) + 1
				if _, err := d.Snapshot(ctx, id, snapID, nil); err != nil {
					t.Fatal(err)
				}
				if err := d.Remove(ctx, id); err != nil {
					t.Fatal(err)
				}
				from = storage.Source{Snapshot: snapID}
			}
			if total < 4096 {
				t.Fatalf("the lower layers' paths take %d bytes, want more than a page", total)
			}
			rootfs := prepare(t, d, "last", from, 0)
			for i := 0; i < depth; i++ {
				want := fmt.Sprintf("gen%02d", i)
				if i < depth-1 {
					want = "again"
				}
				if got := mustRead(t, filepath.Join(rootfs, fmt.Sprintf("home/user/gen-%02d", i))); got != want {
					t.Fatalf("generation %d reads %q, want %q", i, got, want)
				}
			}
			if mustRead(t, filepath.Join(rootfs, "etc/hello")) != "hello\n" {
				t.Fatal("the template is not at the bottom of the chain")
			}
			if err := d.Verify(ctx, from.Snapshot); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestForkKeepsSnapshotIntact changes files a fork inherited from a
// snapshot (overlay copies them up, cloning their data on XFS) and checks
// the snapshot still verifies, and that snapshots built on a snapshot
// keep it from being removed.
func TestForkKeepsSnapshotIntact(t *testing.T) {
	d, _ := newDriver(t)
	ctx := context.Background()
	src := prepare(t, d, "src", storage.Source{Template: "t1"}, 0)
	mustWrite(t, filepath.Join(src, "home/user/big"), strings.Repeat("b", 1<<20))
	if _, err := d.Snapshot(ctx, "src", "s1", nil); err != nil {
		t.Fatal(err)
	}
	fork := prepare(t, d, "fork", storage.Source{Snapshot: "s1"}, 0)
	f, err := os.OpenFile(filepath.Join(fork, "home/user/big"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("more"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chmod(filepath.Join(fork, "home/user"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.Verify(ctx, "s1"); err != nil {
		t.Fatalf("Verify after a fork changed inherited files: %v", err)
	}
	if _, err := d.Snapshot(ctx, "fork", "s2", nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove(ctx, "fork"); err != nil {
		t.Fatal(err)
	}
	if err := d.Verify(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(d.snapLayer("s1"), "home"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.Verify(ctx, "s2"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "s1") {
		t.Fatalf("Verify with a tampered ancestor: %v, want an integrity error naming s1", err)
	}
	if err := d.RemoveSnapshot(ctx, "s1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("RemoveSnapshot of a snapshot another is built on: %v, want conflict", err)
	}
	if err := d.RemoveSnapshot(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	if err := d.RemoveSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Snapshot(ctx, "src", "s1", nil); err != nil {
		t.Fatalf("a removed snapshot id is free again: %v", err)
	}
	if _, err := d.Snapshot(ctx, "src", "s1", nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("snapshot over an existing id: %v, want conflict", err)
	}
	if _, err := d.Prepare(ctx, "src", storage.Source{Template: "t1"}, 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Prepare over an existing layer: %v, want conflict", err)
	}
	if mustRead(t, filepath.Join(src, "etc/hello")) != "hello\n" {
		t.Fatal("a failed Prepare disturbed the existing layer")
	}
	for _, bad := range []string{"", "../x", "a/b", ".hidden"} {
		if _, err := d.Prepare(ctx, bad, storage.Source{Template: "t1"}, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("Prepare with id %q: %v, want invalid argument", bad, err)
		}
	}
	if _, err := d.Prepare(ctx, "x", storage.Source{Snapshot: "nope"}, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Prepare from a missing snapshot: %v, want not found", err)
	}
}

// TestRestartKeepsLayers opens a second driver over a directory whose
// layers are mounted and in use, and checks it finds them untouched,
// cleans leftovers of interrupted work, and keeps allocating fresh
// project ids.
func TestRestartKeepsLayers(t *testing.T) {
	d, _ := newDriver(t)
	ctx := context.Background()
	rootfs := prepare(t, d, "live", storage.Source{Template: "t1"}, 32<<20)
	f, err := os.Create(filepath.Join(rootfs, "home/user/open"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	leftover := filepath.Join(d.tmpDir(), "snap-x-123")
	mustWrite(t, filepath.Join(leftover, "layer/file"), "half a snapshot")
	d2 := openDriver(t, d.dir)
	if _, err := f.WriteString("still writable"); err != nil {
		t.Fatalf("a layer broke across a restart: %v", err)
	}
	if mustRead(t, filepath.Join(rootfs, "home/user/open")) != "still writable" {
		t.Fatal("a layer lost its content across a restart")
	}
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Fatalf("New left an interrupted snapshot behind (%v)", err)
	}
	if ids, err := d2.Layers(ctx); err != nil || len(ids) != 1 || ids[0] != "live" {
		t.Fatalf("Layers after restart: %v, %v", ids, err)
	}
	if d2.ProjectQuotas() {
		var m1, m2 layerMeta
		prepare(t, d2, "second", storage.Source{Template: "t1"}, 0)
		storage.ReadJSON(layerMetaFile(d2.layerDir("live")), &m1, "")
		storage.ReadJSON(layerMetaFile(d2.layerDir("second")), &m2, "")
		if m1.ProjectID == 0 || m2.ProjectID <= m1.ProjectID {
			t.Fatalf("project ids %d then %d after a restart", m1.ProjectID, m2.ProjectID)
		}
	}
	if err := d2.Remove(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	if ids, _ := d2.Layers(ctx); len(ids) != 0 {
		t.Fatalf("Layers after Remove: %v", ids)
	}
}

// TestDiskLimit fills a limited layer, checks the error and the usage,
// and that deleting makes room again, whichever mechanism enforces it.
func TestDiskLimit(t *testing.T) {
	d, _ := newDriver(t)
	ctx := context.Background()
	const limit = 24 << 20
	rootfs := prepare(t, d, "limited", storage.Source{Template: "t1"}, limit)
	t.Logf("project quotas: %v", d.ProjectQuotas())
	buf := make([]byte, 1<<20)
	f, err := os.Create(filepath.Join(rootfs, "home/user/fill"))
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	written := 0
	for i := 0; i < 64 && werr == nil; i++ {
		var n int
		n, werr = f.Write(buf)
		written += n
		if werr == nil {
			werr = f.Sync()
		}
	}
	f.Close()
	if !errors.Is(werr, syscall.EDQUOT) && !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing past the limit: %v", werr)
	}
	if written < limit/2 || written > limit {
		t.Fatalf("wrote %d bytes before the limit of %d", written, limit)
	}
	syscall.Sync()
	if u, err := d.Usage(ctx, "limited"); err != nil || u < int64(written) || u > limit+1<<20 {
		t.Fatalf("usage %d (%v) after writing %d bytes", u, err, written)
	}
	if err := os.Remove(filepath.Join(rootfs, "home/user/fill")); err != nil {
		t.Fatal(err)
	}
	syscall.Sync()
	mustWrite(t, filepath.Join(rootfs, "home/user/after"), strings.Repeat("a", 4<<20))
	if u, err := d.Usage(ctx, "limited"); err != nil || u > 8<<20 {
		t.Fatalf("usage %d (%v) after deleting", u, err)
	}
	// A snapshot of a limited layer restores like any other.
	if _, err := d.Snapshot(ctx, "limited", "ls", nil); err != nil {
		t.Fatal(err)
	}
	r := prepare(t, d, "restored", storage.Source{Snapshot: "ls"}, limit)
	if len(mustRead(t, filepath.Join(r, "home/user/after"))) != 4<<20 {
		t.Fatal("the restore of a limited layer lacks its file")
	}
	if _, err := d.Prepare(ctx, "neg", storage.Source{Template: "t1"}, -1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a negative limit: %v", err)
	}
}

// TestProjectIDs sets and reads a project id on the volume (XFS stores
// them with or without quota enforcement) and checks the quota structs'
// sizes against the kernel's.
func TestProjectIDs(t *testing.T) {
	if s := unsafe.Sizeof(fsDiskQuota{}); s != fsDiskQuotaWantSize {
		t.Fatalf("fs_disk_quota is %d bytes, want %d", s, fsDiskQuotaWantSize)
	}
	if s := unsafe.Sizeof(fsxattr{}); s != 28 {
		t.Fatalf("fsxattr is %d bytes, want 28", s)
	}
	d, _ := newDriver(t)
	dir := filepath.Join(d.tmpDir(), "p")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := setProject(dir, 4242); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "sub/file"), "x")
	for _, p := range []string{dir, filepath.Join(dir, "sub"), filepath.Join(dir, "sub/file")} {
		if id, err := projectOf(p); err != nil || id != 4242 {
			t.Fatalf("project of %s: %d, %v", p, id, err)
		}
	}
}

// TestSnapshotEntryLimit: a snapshot whose layer holds more entries than
// the driver's bound stops during the copy with a resource-exhausted
// error naming the bound, and leaves nothing behind.
func TestSnapshotEntryLimit(t *testing.T) {
	d, _ := newDriver(t)
	d.maxEntries = 50
	ctx := context.Background()
	rootfs, err := d.Prepare(ctx, "l", storage.Source{Template: "t1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Remove(ctx, "l")
	if _, err := d.Snapshot(ctx, "l", "small", nil); err != nil {
		t.Fatalf("a snapshot under the bound: %v", err)
	}
	for i := 0; i < 60; i++ {
		mustWrite(t, filepath.Join(rootfs, "tmp", fmt.Sprint(i)), "")
	}
	_, err = d.Snapshot(ctx, "l", "big", nil)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "more than 50 entries") {
		t.Fatalf("a snapshot over the bound: %v, want resource exhausted naming 50", err)
	}
	if ids, _ := d.Snapshots(ctx); slices.Contains(ids, "big") {
		t.Fatal("the refused snapshot is left")
	}
	if left, _ := os.ReadDir(d.tmpDir()); len(left) != 0 {
		t.Fatalf("the refused snapshot left %d entries in tmp", len(left))
	}
}
