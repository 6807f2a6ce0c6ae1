// Package storagetest is the conformance suite every storage.Driver passes
// (btrfs and overlay): layers from templates and snapshots, forks that
// diverge, chains that store only deltas, disk limits, integrity checks,
// removal rules and restarts. It works on real filesystems, so it needs
// root; a driver's test skips it, saying why, when its driver cannot run.
package storagetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Factory returns a driver keeping its state in dir. Called twice with the
// same dir it must return drivers over the same storage (a restart). The
// returned Tamper changes a file inside snapshot snapID's stored data behind
// the driver's back, however the driver protects it (the integrity test).
type Factory func(t *testing.T, dir string) (storage.Driver, Tamper)

// Tamper modifies snapshot snapID's stored files.
type Tamper func(t *testing.T, snapID string)

// suite is one run's shared state.
type suite struct {
	factory Factory
	dir     string
	d       storage.Driver
	tamper  Tamper
	n       int
}

// templateName is the template every test starts from.
const templateName = "t1"

// Run runs every conformance test against the driver made by factory.
func Run(t *testing.T, factory Factory) {
	if os.Geteuid() != 0 {
		t.Skip("storage drivers need root (mounts, subvolumes, quotas)")
	}
	dir, err := os.MkdirTemp("", "forkbox-storagetest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	s := &suite{factory: factory, dir: dir}
	s.d, s.tamper = factory(t, filepath.Join(dir, "driver"))
	rootfs := filepath.Join(dir, "template")
	if err := makeTemplate(rootfs); err != nil {
		t.Fatal(err)
	}
	if err := s.d.AddTemplate(context.Background(), templateName, rootfs, "v1"); err != nil {
		t.Fatalf("AddTemplate: %v", err)
	}
	t.Run("TemplateLayer", s.testTemplateLayer)
	t.Run("SnapshotAndFork", s.testSnapshotAndFork)
	t.Run("SnapshotCaptured", s.testSnapshotCaptured)
	t.Run("ChainStoresDeltas", s.testChain)
	t.Run("DiskLimit", s.testDiskLimit)
	t.Run("Integrity", s.testIntegrity)
	t.Run("Flush", s.testFlush)
	t.Run("RemoveSnapshot", s.testRemoveSnapshot)
	t.Run("IDs", s.testIDs)
	t.Run("Restart", s.testRestart)
}

// makeTemplate writes a small root filesystem owned by the shifted root.
func makeTemplate(rootfs string) error {
	shift := storage.DefaultIDShift
	for _, d := range []string{"etc", "usr/share"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	files := map[string]string{"etc/hello": "hello from the template\n", "etc/doomed": "delete me\n", "usr/share/data": strings.Repeat("x", 8192)}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(rootfs, p), []byte(c), 0o644); err != nil {
			return err
		}
	}
	if err := os.Symlink("hello", filepath.Join(rootfs, "etc/link")); err != nil {
		return err
	}
	if err := storage.PrepareUserDirs(rootfs, shift); err != nil {
		return err
	}
	return filepath.Walk(rootfs, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(p, filepath.Join(rootfs, "home/user")) {
			return nil
		}
		return os.Lchown(p, shift.UID(0), shift.GID(0))
	})
}

// prepare makes a layer with a fresh id and removes it when the test ends.
func (s *suite) prepare(t *testing.T, from storage.Source, quota int64) (string, string) {
	t.Helper()
	s.n++
	id := fmt.Sprintf("layer%d", s.n)
	rootfs, err := s.d.Prepare(context.Background(), id, from, quota)
	if err != nil {
		t.Fatalf("Prepare %s from %+v: %v", id, from, err)
	}
	t.Cleanup(func() { _ = s.d.Remove(context.Background(), id) })
	return id, rootfs
}

// snapshot snapshots layer id under a fresh snapshot id.
func (s *suite) snapshot(t *testing.T, id string) storage.SnapshotInfo {
	t.Helper()
	s.n++
	snapID := fmt.Sprintf("snap%d", s.n)
	info, err := s.d.Snapshot(context.Background(), id, snapID, nil)
	if err != nil {
		t.Fatalf("Snapshot %s: %v", id, err)
	}
	if info.ID != snapID || !strings.HasPrefix(info.Digest, "sha256:") || info.CreatedAt.IsZero() {
		t.Fatalf("snapshot info %+v", info)
	}
	return info
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func absent(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists (err %v), want it absent", path, err)
	}
}

// testTemplateLayer: a layer shows its template, takes writes, keeps the
// shifted root owner, reports usage, and is gone after Remove.
func (s *suite) testTemplateLayer(t *testing.T) {
	ctx := context.Background()
	id, rootfs := s.prepare(t, storage.Source{Template: templateName}, 0)
	if got := read(t, filepath.Join(rootfs, "etc/hello")); got != "hello from the template\n" {
		t.Fatalf("template file reads %q", got)
	}
	if target, _ := os.Readlink(filepath.Join(rootfs, "etc/link")); target != "hello" {
		t.Fatalf("template symlink -> %q", target)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(rootfs, &st); err != nil || int(st.Uid) != storage.DefaultIDShift.UID(0) {
		t.Fatalf("rootfs owner %d (%v), want the shifted root", st.Uid, err)
	}
	write(t, filepath.Join(rootfs, "home/user/big"), strings.Repeat("y", 1<<20))
	syscall.Sync()
	if u, err := s.d.Usage(ctx, id); err != nil || u < 1<<20 {
		t.Fatalf("usage %d after writing 1 MiB (%v)", u, err)
	}
	ids, err := s.d.Layers(ctx)
	if err != nil || !contains(ids, id) {
		t.Fatalf("Layers %v (%v) lacks %s", ids, err, id)
	}
	if err := s.d.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	absent(t, filepath.Join(rootfs, "home/user/big"))
	if ids, _ := s.d.Layers(ctx); contains(ids, id) {
		t.Fatalf("Layers still lists %s after Remove", id)
	}
	if err := s.d.Remove(ctx, id); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if _, err := s.d.Prepare(ctx, "nolayer", storage.Source{Template: "no-such-template"}, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Prepare from an unknown template: %v, want not found", err)
	}
}

// testSnapshotAndFork: files written (and deleted) before a snapshot are
// in every fork; forks and the parent diverge independently; removing the
// parent layer does not break its forks.
func (s *suite) testSnapshotAndFork(t *testing.T) {
	parent, prootfs := s.prepare(t, storage.Source{Template: templateName}, 0)
	write(t, filepath.Join(prootfs, "home/user/f1"), "v1")
	write(t, filepath.Join(prootfs, "home/user/dir/nested"), "nested")
	if err := os.Remove(filepath.Join(prootfs, "etc/doomed")); err != nil {
		t.Fatal(err)
	}
	snap := s.snapshot(t, parent)
	if snap.Parent != "" || snap.Template != templateName {
		t.Fatalf("first snapshot: parent %q template %q", snap.Parent, snap.Template)
	}
	_, a := s.prepare(t, storage.Source{Snapshot: snap.ID}, 0)
	_, b := s.prepare(t, storage.Source{Snapshot: snap.ID}, 0)
	for _, r := range []string{a, b} {
		if read(t, filepath.Join(r, "home/user/f1")) != "v1" || read(t, filepath.Join(r, "home/user/dir/nested")) != "nested" {
			t.Fatal("a fork lacks a file written before the snapshot")
		}
		absent(t, filepath.Join(r, "etc/doomed"))
		if read(t, filepath.Join(r, "etc/hello")) != "hello from the template\n" {
			t.Fatal("a fork lacks the template's files")
		}
	}
	write(t, filepath.Join(a, "home/user/f1"), "A")
	write(t, filepath.Join(b, "home/user/only-b"), "B")
	write(t, filepath.Join(prootfs, "home/user/f1"), "parent-after")
	if read(t, filepath.Join(b, "home/user/f1")) != "v1" {
		t.Fatal("a write in fork A is visible in fork B")
	}
	if read(t, filepath.Join(prootfs, "home/user/f1")) != "parent-after" || read(t, filepath.Join(a, "home/user/f1")) != "A" {
		t.Fatal("fork and parent did not diverge")
	}
	absent(t, filepath.Join(a, "home/user/only-b"))
	absent(t, filepath.Join(prootfs, "home/user/only-b"))
	if err := s.d.Remove(context.Background(), parent); err != nil {
		t.Fatal(err)
	}
	if read(t, filepath.Join(a, "home/user/dir/nested")) != "nested" || read(t, filepath.Join(b, "home/user/only-b")) != "B" {
		t.Fatal("forks broke when their parent layer was removed")
	}
}

// testSnapshotCaptured: Snapshot calls captured exactly once, before it
// returns, once the layer's files are captured: what the sandbox writes
// from then on (it may be thawed) is not in the snapshot, which still
// passes its integrity check.
func (s *suite) testSnapshotCaptured(t *testing.T) {
	id, rootfs := s.prepare(t, storage.Source{Template: templateName}, 0)
	write(t, filepath.Join(rootfs, "home/user/before"), "in")
	calls := 0
	s.n++
	snapID := fmt.Sprintf("snap%d", s.n)
	info, err := s.d.Snapshot(context.Background(), id, snapID, func() {
		calls++
		write(t, filepath.Join(rootfs, "home/user/after"), "out")
		write(t, filepath.Join(rootfs, "home/user/before"), "changed")
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("captured called %d times, want once", calls)
	}
	t.Cleanup(func() { _ = s.d.RemoveSnapshot(context.Background(), info.ID) })
	if err := s.d.Verify(context.Background(), info.ID); err != nil {
		t.Fatalf("Verify after writes that followed the capture: %v", err)
	}
	_, r := s.prepare(t, storage.Source{Snapshot: info.ID}, 0)
	if read(t, filepath.Join(r, "home/user/before")) != "in" {
		t.Fatal("a write made after the capture changed the snapshot")
	}
	absent(t, filepath.Join(r, "home/user/after"))
	if _, err := s.d.Snapshot(context.Background(), "nosuchlayer", "snapnone", func() { calls++ }); err == nil || calls != 1 {
		t.Fatalf("snapshot of a missing layer: %v, captured calls %d (want an error and no call)", err, calls)
	}
}

// testChain: 20 generations of restore → write → snapshot; the last layer
// sees every generation's file, and each snapshot stores only its delta.
func (s *suite) testChain(t *testing.T) {
	const depth, chunk = 20, 256 << 10
	from := storage.Source{Template: templateName}
	var prev string
	for i := 0; i < depth; i++ {
		id, rootfs := s.prepare(t, from, 0)
		write(t, filepath.Join(rootfs, fmt.Sprintf("home/user/gen-%02d", i)), strings.Repeat(string(rune('a'+i%26)), chunk))
		info := s.snapshot(t, id)
		if info.Parent != prev {
			t.Fatalf("generation %d: parent %q, want %q", i, info.Parent, prev)
		}
		if info.SizeBytes < chunk || info.SizeBytes > 2*chunk+256<<10 {
			t.Fatalf("generation %d snapshot holds %d bytes, want about %d (only its own delta)", i, info.SizeBytes, chunk)
		}
		if err := s.d.Remove(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		prev, from = info.ID, storage.Source{Snapshot: info.ID}
	}
	_, rootfs := s.prepare(t, from, 0)
	for i := 0; i < depth; i++ {
		if got := read(t, filepath.Join(rootfs, fmt.Sprintf("home/user/gen-%02d", i))); len(got) != chunk {
			t.Fatalf("generation %d file has %d bytes in the last restore", i, len(got))
		}
	}
	if err := s.d.Verify(context.Background(), prev); err != nil {
		t.Fatalf("Verify of a 20-deep chain: %v", err)
	}
}

// testDiskLimit: writing past the limit fails with ENOSPC or EDQUOT, and
// after freeing space writing works again.
func (s *suite) testDiskLimit(t *testing.T) {
	const limit = 16 << 20
	_, rootfs := s.prepare(t, storage.Source{Template: templateName}, limit)
	f, err := os.Create(filepath.Join(rootfs, "tmp/fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := bytes.Repeat([]byte{1}, 1<<20)
	var werr error
	for i := 0; i < 64 && werr == nil; i++ {
		if _, werr = f.Write(buf); werr == nil {
			werr = f.Sync()
		}
	}
	f.Close()
	if !errors.Is(werr, syscall.ENOSPC) && !errors.Is(werr, syscall.EDQUOT) {
		t.Fatalf("writing 64 MiB into a 16 MiB layer ended with %v, want ENOSPC or EDQUOT", werr)
	}
	if err := os.Remove(filepath.Join(rootfs, "tmp/fill")); err != nil {
		t.Fatal(err)
	}
	syscall.Sync()
	write(t, filepath.Join(rootfs, "tmp/after"), strings.Repeat("z", 1<<20))
}

// testIntegrity: Verify passes on an untouched snapshot and fails with
// ErrConflict once its stored files are changed.
func (s *suite) testIntegrity(t *testing.T) {
	id, rootfs := s.prepare(t, storage.Source{Template: templateName}, 0)
	write(t, filepath.Join(rootfs, "home/user/data"), "original")
	info := s.snapshot(t, id)
	if err := s.d.Verify(context.Background(), info.ID); err != nil {
		t.Fatalf("Verify of an untouched snapshot: %v", err)
	}
	s.tamper(t, info.ID)
	if err := s.d.Verify(context.Background(), info.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Verify after tampering: %v, want an integrity (conflict) error", err)
	}
}

// testFlush: Flush leaves none of a layer's unsynced writes dirty in the
// page cache (read with cachestat(2), Linux 6.5), so the snapshot taken
// next, while the sandbox is frozen, has nothing of them to write.
func (s *suite) testFlush(t *testing.T) {
	id, rootfs := s.prepare(t, storage.Source{Template: templateName}, 0)
	write(t, filepath.Join(rootfs, "home/user/unsynced"), strings.Repeat("u", 32<<20))
	// The pages are cached on the file that holds the data: under an
	// overlay mount, the upper directory's.
	path := filepath.Join(backingDir(t, rootfs), "home/user/unsynced")
	before, err := dirtyPages(path)
	if errors.Is(err, syscall.ENOSYS) {
		t.Skip("the kernel has no cachestat(2) (Linux 6.5) to see dirty pages with")
	}
	if err != nil {
		t.Fatal(err)
	}
	if before == 0 {
		t.Skip("the kernel wrote the file back already; nothing to flush")
	}
	if err := s.d.Flush(context.Background(), id); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if after, err := dirtyPages(path); err != nil || after != 0 {
		t.Fatalf("after Flush %d of the file's pages are dirty or under writeback (%v), before %d; want none", after, err, before)
	}
	if err := s.d.Flush(context.Background(), "nosuchlayer"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Flush of an unknown layer: %v, want not found", err)
	}
}

// backingDir returns the directory holding the files written under
// rootfs: rootfs itself, or the upper directory of the overlay mounted
// there (from /proc/self/mountinfo).
func backingDir(t *testing.T, rootfs string) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(rootfs, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.OVERLAYFS_SUPER_MAGIC {
		return rootfs
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[4] != rootfs {
			continue
		}
		for _, opt := range strings.Split(f[len(f)-1], ",") {
			if dir, ok := strings.CutPrefix(opt, "upperdir="); ok {
				return dir
			}
		}
	}
	t.Fatalf("no upperdir for the overlay at %s in mountinfo", rootfs)
	return ""
}

// dirtyPages returns how many of path's cached pages are dirty or under
// writeback (cachestat(2) over the whole file).
func dirtyPages(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var rng struct{ off, len uint64 } // struct cachestat_range; len 0: to the end
	var cs struct{ cache, dirty, writeback, evicted, recentlyEvicted uint64 }
	_, _, e := syscall.Syscall6(unix.SYS_CACHESTAT, f.Fd(), uintptr(unsafe.Pointer(&rng)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return cs.dirty + cs.writeback, nil
}

// testRemoveSnapshot: a snapshot goes away once nothing uses it; removing
// a missing snapshot is fine.
func (s *suite) testRemoveSnapshot(t *testing.T) {
	ctx := context.Background()
	id, _ := s.prepare(t, storage.Source{Template: templateName}, 0)
	info := s.snapshot(t, id)
	child, _ := s.prepare(t, storage.Source{Snapshot: info.ID}, 0)
	if err := s.d.RemoveSnapshot(ctx, info.ID); err != nil && !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("RemoveSnapshot with a layer on it: %v, want nil or conflict", err)
	}
	if err := s.d.Remove(ctx, child); err != nil {
		t.Fatal(err)
	}
	if err := s.d.RemoveSnapshot(ctx, info.ID); err != nil {
		t.Fatalf("RemoveSnapshot: %v", err)
	}
	if ids, _ := s.d.Snapshots(ctx); contains(ids, info.ID) {
		t.Fatalf("Snapshots still lists %s", info.ID)
	}
	if err := s.d.RemoveSnapshot(ctx, info.ID); err != nil {
		t.Fatalf("second RemoveSnapshot: %v", err)
	}
}

// testRestart: a second driver over the same directory sees the layers
// and snapshots of the first, and layers keep their content.
func (s *suite) testRestart(t *testing.T) {
	ctx := context.Background()
	id, rootfs := s.prepare(t, storage.Source{Template: templateName}, 0)
	write(t, filepath.Join(rootfs, "home/user/kept"), "kept")
	info := s.snapshot(t, id)
	if err := s.d.Close(); err != nil {
		t.Fatal(err)
	}
	s.d, s.tamper = s.factory(t, filepath.Join(s.dir, "driver"))
	// The daemon re-adds its templates at start-up; the same version is a no-op.
	if err := s.d.AddTemplate(ctx, templateName, filepath.Join(s.dir, "template"), "v1"); err != nil {
		t.Fatalf("AddTemplate again after restart: %v", err)
	}
	ids, err := s.d.Layers(ctx)
	if err != nil || !contains(ids, id) {
		t.Fatalf("after restart Layers %v (%v) lacks %s", ids, err, id)
	}
	snaps, err := s.d.Snapshots(ctx)
	if err != nil || !contains(snaps, info.ID) {
		t.Fatalf("after restart Snapshots %v (%v) lacks %s", snaps, err, info.ID)
	}
	if read(t, filepath.Join(rootfs, "home/user/kept")) != "kept" {
		t.Fatal("a layer lost its content across a restart")
	}
	_, fork := s.prepare(t, storage.Source{Snapshot: info.ID}, 0)
	if read(t, filepath.Join(fork, "home/user/kept")) != "kept" {
		t.Fatal("a fork after restart lacks the snapshot's file")
	}
	if err := s.d.Verify(ctx, info.ID); err != nil {
		t.Fatalf("Verify after restart: %v", err)
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
