package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"golang.org/x/sys/unix"
)

// newWithTemplate opens a driver in a fresh directory and adds template
// "t" made by makeRootfs. It returns the driver and its directory.
func newWithTemplate(t *testing.T) (*Driver, string) {
	t.Helper()
	needBtrfs(t)
	base := testDir(t)
	d := openDriver(t, filepath.Join(base, "fs"))
	rootfs := filepath.Join(base, "rootfs")
	makeRootfs(t, rootfs)
	if err := d.AddTemplate(context.Background(), "t", rootfs, "v1"); err != nil {
		t.Fatalf("AddTemplate: %v", err)
	}
	return d, base
}

// TestTemplateCopy: the template keeps owners, modes (setuid too), hard
// links, symlinks and FIFOs, skips device nodes, and is read-only; the
// layer's root keeps the shifted owner.
func TestTemplateCopy(t *testing.T) {
	d, _ := newWithTemplate(t)
	tp := d.templatePath("t")
	if err := os.WriteFile(filepath.Join(tp, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("template is writable: %v", err)
	}
	root := uint32(storage.DefaultIDShift.UID(0))
	var st, st2 unix.Stat_t
	check := func(rel string, mode uint32, uid uint32) {
		t.Helper()
		if err := unix.Lstat(filepath.Join(tp, rel), &st); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if st.Mode != mode || st.Uid != uid {
			t.Fatalf("%s: mode %o uid %d, want %o %d", rel, st.Mode, st.Uid, mode, uid)
		}
	}
	check(".", unix.S_IFDIR|0o755, root)
	check("usr/bin/suid", unix.S_IFREG|0o4755, root)
	check("etc/link", unix.S_IFLNK|0o777, root)
	check("dev/fifo", unix.S_IFIFO|0o600, root)
	check("tmp", unix.S_IFDIR|0o1777, root)
	check("home/user", unix.S_IFDIR|0o755, uint32(storage.DefaultIDShift.UID(storage.UserUID)))
	unix.Lstat(filepath.Join(tp, "usr/bin/tool"), &st)
	unix.Lstat(filepath.Join(tp, "usr/bin/tool2"), &st2)
	if st.Ino != st2.Ino || st.Nlink != 2 {
		t.Fatal("hard link not kept")
	}
	if _, err := os.Lstat(filepath.Join(tp, "dev/null")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("device node copied: %v", err)
	}
	rootfs, err := d.Prepare(context.Background(), "l", storage.Source{Template: "t"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(rootfs, &st); err != nil || st.Uid != root || st.Mode&0o7777 != 0o755 {
		t.Fatalf("layer root uid %d mode %o (%v)", st.Uid, st.Mode, err)
	}
	if _, err := d.Prepare(context.Background(), "l", storage.Source{Template: "t"}, 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Prepare of an existing id: %v, want conflict", err)
	}
	if _, err := d.Prepare(context.Background(), "../x", storage.Source{Template: "t"}, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Prepare with a bad id: %v", err)
	}
	if _, err := d.Prepare(context.Background(), "m", storage.Source{Snapshot: "nope"}, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Prepare from a missing snapshot: %v", err)
	}
}

// TestChainDeltas: 20 generations of snapshot → prepare from it → write
// 1 MiB → snapshot; every snapshot's size is about 1 MiB (its own delta,
// not the chain's total) and the last one verifies.
func TestChainDeltas(t *testing.T) {
	d, _ := newWithTemplate(t)
	ctx := context.Background()
	from, prev := storage.Source{Template: "t"}, ""
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("gen%d", i)
		rootfs, err := d.Prepare(ctx, id, from, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeFile(filepath.Join(rootfs, "home/user", id), 1<<20, byte('a'+i)); err != nil {
			t.Fatal(err)
		}
		info, err := d.Snapshot(ctx, id, "s"+id, nil)
		if err != nil {
			t.Fatal(err)
		}
		if info.Parent != prev || info.Template != "t" {
			t.Fatalf("gen %d: parent %q template %q", i, info.Parent, info.Template)
		}
		if info.SizeBytes < 1<<20 || info.SizeBytes > 1<<20+256<<10 {
			t.Fatalf("gen %d: snapshot size %d, want about 1 MiB", i, info.SizeBytes)
		}
		if i%2 == 0 { // keep every other layer: forks do not depend on them either way
			if err := d.Remove(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		prev, from = info.ID, storage.Source{Snapshot: info.ID}
	}
	if err := d.Verify(ctx, prev); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	// Removing snapshots in the middle breaks nothing, and Verify still
	// checks the remaining ancestors.
	for _, s := range []string{"sgen5", "sgen10"} {
		if err := d.RemoveSnapshot(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	rootfs, err := d.Prepare(ctx, "last", from, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if fi, err := os.Stat(filepath.Join(rootfs, "home/user", fmt.Sprintf("gen%d", i))); err != nil || fi.Size() != 1<<20 {
			t.Fatalf("gen %d file in the last layer: %v", i, err)
		}
	}
	tamper(t, d, "sgen3")
	if err := d.Verify(ctx, prev); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), `"sgen3" failed its integrity check`) {
		t.Fatalf("Verify with a tampered ancestor: %v", err)
	}
	if err := d.Verify(ctx, "sgen2"); err != nil {
		t.Fatalf("Verify below the tampered snapshot: %v", err)
	}
}

// TestRepeatedSnapshots: a second snapshot of one layer reports what the
// layer wrote since it was prepared, and Usage agrees.
func TestRepeatedSnapshots(t *testing.T) {
	d, _ := newWithTemplate(t)
	ctx := context.Background()
	rootfs, err := d.Prepare(ctx, "l", storage.Source{Template: "t"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(filepath.Join(rootfs, "tmp/a"), 2<<20, 'a')
	s1, err := d.Snapshot(ctx, "l", "s1", nil)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(filepath.Join(rootfs, "tmp/b"), 1<<20, 'b')
	s2, err := d.Snapshot(ctx, "l", "s2", nil)
	if err != nil {
		t.Fatal(err)
	}
	if s1.SizeBytes < 2<<20 || s2.SizeBytes < 3<<20 || s2.SizeBytes > 3<<20+512<<10 {
		t.Fatalf("sizes %d then %d, want about 2 and 3 MiB", s1.SizeBytes, s2.SizeBytes)
	}
	if u, err := d.Usage(ctx, "l"); err != nil || u < s2.SizeBytes || u > s2.SizeBytes+256<<10 {
		t.Fatalf("usage %d (%v), want about %d", u, err, s2.SizeBytes)
	}
	if _, err := d.Snapshot(ctx, "l", "s1", nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("snapshot to an existing id: %v", err)
	}
	if _, err := d.Snapshot(ctx, "nope", "s3", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("snapshot of a missing layer: %v", err)
	}
	if _, err := d.Usage(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("usage of a missing layer: %v", err)
	}
}

// TestQuota: writes past the limit fail with EDQUOT; data inherited from
// the source does not count; after rm, writing works again.
func TestQuota(t *testing.T) {
	d, _ := newWithTemplate(t)
	ctx := context.Background()
	src, _ := d.Prepare(ctx, "src", storage.Source{Template: "t"}, 0)
	if err := writeFile(filepath.Join(src, "tmp/inherited"), 32<<20, 'i'); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Snapshot(ctx, "src", "base", nil); err != nil {
		t.Fatal(err)
	}
	rootfs, err := d.Prepare(ctx, "q", storage.Source{Snapshot: "base"}, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(rootfs, "tmp/small"), 4<<20, 's'); err != nil {
		t.Fatalf("4 MiB under an 8 MiB limit with 32 MiB inherited: %v", err)
	}
	err = writeFile(filepath.Join(rootfs, "tmp/big"), 16<<20, 'b')
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("16 MiB more under an 8 MiB limit: %v, want EDQUOT", err)
	}
	t.Logf("past the limit: %v", err)
	os.Remove(filepath.Join(rootfs, "tmp/big"))
	os.Remove(filepath.Join(rootfs, "tmp/small"))
	syscall.Sync()
	if err := writeFile(filepath.Join(rootfs, "tmp/again"), 6<<20, 'a'); err != nil {
		t.Fatalf("writing after freeing space: %v", err)
	}
	if err := writeFile(filepath.Join(rootfs, "tmp/more"), 4<<20, 'm'); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("10 MiB under an 8 MiB limit: %v, want EDQUOT", err)
	}
	if _, err := d.Snapshot(ctx, "q", "full", nil); err != nil {
		t.Fatalf("snapshot of a layer at its limit: %v", err)
	}
	if _, err := d.Prepare(ctx, "neg", storage.Source{Template: "t"}, -1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("negative quota: %v", err)
	}
}

// TestRestartAndTemplates: a second New over the same directory finds the
// mount and everything on it; an interrupted snapshot is cleaned up; a
// template re-added with the same version is kept, with a new version
// replaced, and removing it leaves its layers intact.
func TestRestartAndTemplates(t *testing.T) {
	d, base := newWithTemplate(t)
	ctx := context.Background()
	rootfs, _ := d.Prepare(ctx, "l", storage.Source{Template: "t"}, 4<<20)
	writeFile(filepath.Join(rootfs, "home/user/kept"), 1000, 'k')
	info, err := d.Snapshot(ctx, "l", "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A snapshot subvolume without metadata: Snapshot was interrupted.
	if err := snapshotInto(rootfs, d.snapshotsDir(), "half", true); err != nil {
		t.Fatal(err)
	}
	d.Close()

	d2, err := New(ctx, Options{Dir: d.dir, Shift: storage.DefaultIDShift})
	if err != nil {
		t.Fatalf("second New: %v", err)
	}
	defer d2.Close()
	if d2.mounted {
		t.Fatal("second New mounted again instead of finding the mount")
	}
	if ls, _ := d2.Layers(ctx); len(ls) != 1 || ls[0] != "l" {
		t.Fatalf("layers after restart %v", ls)
	}
	if ss, _ := d2.Snapshots(ctx); len(ss) != 1 || ss[0] != "s" {
		t.Fatalf("snapshots after restart %v (the interrupted one must be gone)", ss)
	}
	if err := d2.Verify(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	old := d2.templatePath("t")
	var before, after unix.Stat_t
	unix.Stat(filepath.Join(old, "etc/hello"), &before)
	if err := d2.AddTemplate(ctx, "t", filepath.Join(base, "rootfs"), "v1"); err != nil {
		t.Fatal(err)
	}
	unix.Stat(filepath.Join(old, "etc/hello"), &after)
	if before.Ctim != after.Ctim || before.Dev != after.Dev {
		t.Fatal("AddTemplate with the same version rebuilt the template")
	}
	os.WriteFile(filepath.Join(base, "rootfs/etc/hello"), []byte("v2\n"), 0o644)
	if err := d2.AddTemplate(ctx, "t", filepath.Join(base, "rootfs"), "v2"); err != nil {
		t.Fatal(err)
	}
	r2, err := d2.Prepare(ctx, "l2", storage.Source{Template: "t"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(r2, "etc/hello")); string(b) != "v2\n" {
		t.Fatalf("layer of the replaced template reads %q", b)
	}
	if err := d2.RemoveTemplate(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(rootfs, "etc/hello")); string(b) != "hello\n" {
		t.Fatalf("old layer reads %q after its template went", b)
	}
	if _, err := d2.Prepare(ctx, "l3", storage.Source{Template: "t"}, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Prepare from a removed template: %v", err)
	}
	entries, _ := os.ReadDir(d2.templatesDir())
	if len(entries) != 0 {
		t.Fatalf("templates dir not empty: %v", entries)
	}
	for _, id := range []string{"l", "l2"} {
		if err := d2.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := d2.RemoveSnapshot(ctx, "s"); err != nil {
		t.Fatal(err)
	}
}

// TestOnExistingBtrfs: a Dir that is on btrfs already is used in place,
// without an image.
func TestOnExistingBtrfs(t *testing.T) {
	outer := openDriver(t, filepath.Join(testDir(t), "fs"))
	ctx := context.Background()
	dir := filepath.Join(outer.dir, "inner")
	d, err := New(ctx, Options{Dir: dir, Shift: storage.DefaultIDShift})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.mounted {
		t.Fatal("New mounted an image on a directory that is on btrfs")
	}
	if _, err := os.Stat(dir + ".img"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image created: %v", err)
	}
	rootfs := filepath.Join(outer.dir, "rootfs")
	makeRootfs(t, rootfs)
	if err := d.AddTemplate(ctx, "t", rootfs, "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prepare(ctx, "l", storage.Source{Template: "t"}, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Snapshot(ctx, "l", "s", nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Verify(ctx, "s"); err != nil {
		t.Fatal(err)
	}
}

// TestAccountingRebuilt: once the kernel stops accounting qgroups (here
// the deletion of a layer whose shared tree reaches the drop threshold,
// lowered to 0 so that a small tree does; New had raised it to the
// maximum level), disk limits are no longer enforced until a rescan; the
// driver rescans, so a limited layer made afterwards still hits EDQUOT,
// and the background watch clears the flag for running layers too.
func TestAccountingRebuilt(t *testing.T) {
	d, _ := newWithTemplate(t)
	if d.qgroupDir == "" {
		t.Skip("this kernel shows no qgroups directory in sysfs (Linux 5.9) to provoke and watch the flag with")
	}
	knob := filepath.Join(d.qgroupDir, "drop_subtree_threshold")
	if b, err := os.ReadFile(knob); err == nil && strings.TrimSpace(string(b)) != "8" {
		t.Fatalf("drop_subtree_threshold after New = %q, want 8", b)
	}
	if err := os.WriteFile(knob, []byte("0"), 0); err != nil {
		t.Skipf("cannot lower drop_subtree_threshold to provoke the kernel: %v", err)
	}
	ctx := context.Background()
	// A tree of more than one level: a few thousand files.
	wide, err := d.Prepare(ctx, "wide", storage.Source{Template: "t"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3000; i++ {
		if err := os.WriteFile(filepath.Join(wide, "tmp", fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Snapshot(ctx, "wide", "widesnap", nil); err != nil {
		t.Fatal(err)
	}
	victim, err := d.Prepare(ctx, "victim", storage.Source{Snapshot: "widesnap"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(victim, "tmp/f1"), 1<<20, 'v'); err != nil {
		t.Fatal(err)
	}
	syscall.Sync()
	if err := d.Remove(ctx, "victim"); err != nil {
		t.Fatal(err)
	}
	// The cleaner drops the subvolume in the background; the flag rises
	// then (and the watch may already have cleared it again).
	lost := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !lost && d.rescans.Load() == 0; {
		_ = commitFS(d.rootFd) // a commit wakes the cleaner
		lost, _ = d.accountingLost()
		time.Sleep(20 * time.Millisecond)
	}
	if !lost && d.rescans.Load() == 0 {
		t.Fatal("deleting a layer over a threshold of 0 never made the kernel give up the accounting; the test provokes nothing")
	}
	if err := os.WriteFile(knob, []byte("8"), 0); err != nil {
		t.Fatal(err)
	}
	limited, err := d.Prepare(ctx, "limited", storage.Source{Template: "t"}, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(limited, "tmp/big"), 32<<20, 'b'); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("32 MiB under an 8 MiB limit after the kernel lost the accounting: %v, want EDQUOT", err)
	}
	if lost, err := d.accountingLost(); err != nil || lost || d.rescans.Load() == 0 {
		t.Fatalf("accounting lost %v (%v) after %d rescans, want rebuilt", lost, err, d.rescans.Load())
	}
}
