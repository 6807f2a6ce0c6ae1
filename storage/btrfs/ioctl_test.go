package btrfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIoctlNumbers checks the computed request numbers against the values
// the kernel headers give on x86-64 (struct sizes included).
func TestIoctlNumbers(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"SNAP_CREATE_V2", iocSnapCreateV2, 0x50009417},
		{"SUBVOL_CREATE", iocSubvolCreate, 0x5000940e},
		{"SNAP_DESTROY", iocSnapDestroy, 0x5000940f},
		{"TREE_SEARCH", iocTreeSearch, 0xd0009411},
		{"INO_LOOKUP", iocInoLookup, 0xd0009412},
		{"SYNC", iocSync, 0x9408},
		{"START_SYNC", iocStartSync, 0x80089418},
		{"WAIT_SYNC", iocWaitSync, 0x40089416},
		{"SUBVOL_GETFLAGS", iocSubvolGetFlags, 0x80089419},
		{"SUBVOL_SETFLAGS", iocSubvolSetFlags, 0x4008941a},
		{"QUOTA_CTL", iocQuotaCtl, 0xc0109428},
		{"QGROUP_CREATE", iocQgroupCreate, 0x4010942a},
		{"QGROUP_LIMIT", iocQgroupLimit, 0x8030942b},
		{"QUOTA_RESCAN", iocQuotaRescan, 0x4040942c},
		{"QUOTA_RESCAN_WAIT", iocRescanWait, 0x942e},
	} {
		if c.got != c.want {
			t.Errorf("BTRFS_IOC_%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

// TestSubvolumeIoctls exercises the wrappers on a real loop-backed btrfs:
// create, snapshot (writable and read-only), flags, ids, qgroup numbers,
// exclusive limits and destroy.
func TestSubvolumeIoctls(t *testing.T) {
	d := openDriver(t, filepath.Join(testDir(t), "fs"))
	top, err := openDir(d.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(top)
	if err := createSubvolume(top, "a"); err != nil {
		t.Fatalf("create subvolume: %v", err)
	}
	if err := createSubvolume(top, "a"); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("creating it again: %v, want EEXIST", err)
	}
	a := filepath.Join(d.dir, "a")
	if !isSubvolumeRoot(a) || isSubvolumeRoot(d.layersDir()) {
		t.Fatal("isSubvolumeRoot is wrong")
	}
	if err := writeFile(filepath.Join(a, "data"), 4<<20, 'a'); err != nil {
		t.Fatal(err)
	}
	aFd, err := openDir(a)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(aFd)
	aID, err := subvolumeID(aFd)
	if err != nil || aID < firstFreeObjectID {
		t.Fatalf("subvolume id %d, %v", aID, err)
	}
	if topID, _ := subvolumeID(top); topID != 5 {
		t.Fatalf("top-level subvolume id %d, want 5", topID)
	}
	if err := syncFS(aFd); err != nil {
		t.Fatal(err)
	}
	u, err := readQgroup(top, aID)
	if err != nil || u.Exclusive < 4<<20 || u.Referenced < u.Exclusive {
		t.Fatalf("qgroup of a: %+v, %v; want >= 4 MiB exclusive", u, err)
	}
	if _, err := readQgroup(top, 999999); !errors.Is(err, unix.ENOENT) && err != nil {
		t.Fatalf("missing qgroup: %v", err)
	}

	if err := snapshotSubvolume(aFd, top, "ro", true); err != nil {
		t.Fatalf("read-only snapshot: %v", err)
	}
	ro := filepath.Join(d.dir, "ro")
	if b, _ := os.ReadFile(filepath.Join(ro, "data")); len(b) != 4<<20 {
		t.Fatalf("snapshot holds %d bytes of data", len(b))
	}
	if err := os.WriteFile(filepath.Join(ro, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write into a read-only snapshot: %v, want EROFS", err)
	}
	roFd, err := openDir(ro)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(roFd)
	if f, err := subvolumeFlags(roFd); err != nil || f&subvolReadOnly == 0 {
		t.Fatalf("flags %#x, %v; want read-only", f, err)
	}
	if err := setReadOnly(roFd, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ro, "new"), nil, 0o644); err != nil {
		t.Fatalf("write after clearing read-only: %v", err)
	}
	if err := setReadOnly(roFd, true); err != nil {
		t.Fatal(err)
	}

	// A writable snapshot shares the data: its exclusive count is tiny,
	// and a limit on it caps only what it writes itself.
	if err := snapshotSubvolume(roFd, top, "rw", false); err != nil {
		t.Fatalf("writable snapshot: %v", err)
	}
	rw := filepath.Join(d.dir, "rw")
	rwFd, err := openDir(rw)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rwFd)
	rwID, _ := subvolumeID(rwFd)
	if err := limitExclusive(top, rwID, 2<<20); err != nil {
		t.Fatalf("limit: %v", err)
	}
	excl, err := exclusiveOf(rwFd, false)
	if err != nil || excl > 256<<10 {
		t.Fatalf("fresh snapshot exclusive %d, %v", excl, err)
	}
	if err := writeFile(filepath.Join(rw, "big"), 8<<20, 'b'); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("writing 8 MiB under a 2 MiB limit: %v, want EDQUOT", err)
	}

	if err := commitFS(rwFd); err != nil {
		t.Fatalf("commit: %v", err)
	}
	ids, err := level0Qgroups(top)
	if err != nil || len(ids) < 4 || ids[0] != 5 {
		t.Fatalf("level-0 qgroups %v, %v", ids, err)
	}
	if ok, err := subvolumeExists(top, rwID); !ok || err != nil {
		t.Fatalf("subvolumeExists(%d) = %v, %v", rwID, ok, err)
	}
	if ok, err := subvolumeExists(top, 99999); ok || err != nil {
		t.Fatalf("subvolumeExists(99999) = %v, %v", ok, err)
	}

	for _, n := range []string{"rw", "ro", "a"} {
		if err := destroySubvolume(top, n); err != nil {
			t.Fatalf("destroy %s: %v", n, err)
		}
	}
	if _, err := os.Stat(a); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("destroyed subvolume still there: %v", err)
	}
	_ = removeQgroup(top, aID) // may be EBUSY until the cleaner has run
}

// TestDestroyNested: a layer with subvolumes nested inside (which a
// sandbox can create) is removed completely.
func TestDestroyNested(t *testing.T) {
	d := openDriver(t, filepath.Join(testDir(t), "fs"))
	dirFd, err := openDir(d.layersDir())
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirFd)
	if err := createSubvolume(dirFd, "outer"); err != nil {
		t.Fatal(err)
	}
	outer := filepath.Join(d.layersDir(), "outer")
	if err := os.MkdirAll(filepath.Join(outer, "x/y"), 0o755); err != nil {
		t.Fatal(err)
	}
	inFd, err := openDir(filepath.Join(outer, "x/y"))
	if err != nil {
		t.Fatal(err)
	}
	err = createSubvolume(inFd, "inner")
	unix.Close(inFd)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(filepath.Join(outer, "x/y/inner/f"), 1000, 'x')
	if err := d.destroy(d.layersDir(), "outer"); err != nil {
		t.Fatalf("destroy with a nested subvolume: %v", err)
	}
	if _, err := os.Stat(outer); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("outer still exists: %v", err)
	}
}
