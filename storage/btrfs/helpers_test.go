package btrfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/storage"
	"golang.org/x/sys/unix"
)

// testImageBytes is the sparse image size of test filesystems (8 GiB of
// address space; only what tests write takes disk blocks).
const testImageBytes = 2 << 30

// needBtrfs skips t unless it runs as root on a host that supports btrfs.
func needBtrfs(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("btrfs tests need root (loop devices, mounts, subvolume ioctls)")
	}
	if err := Supported(); err != nil {
		t.Skipf("btrfs is not usable on this host: %v", err)
	}
}

// testDir returns a fresh temporary directory (traversable by others, as
// the data directory is) that is removed when t ends, after the
// filesystems mounted inside it are unmounted.
func testDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// openDriver opens a driver in dir. If it mounted the image, the
// filesystem is unmounted when t ends (the loop device auto-clears).
func openDriver(t *testing.T, dir string) *Driver {
	t.Helper()
	needBtrfs(t)
	d, err := New(context.Background(), Options{Dir: dir, ImageBytes: testImageBytes, Shift: storage.DefaultIDShift})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if d.mounted {
		t.Cleanup(func() { unmount(t, dir) })
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// unmount unmounts dir (lazily if something still holds it).
func unmount(t *testing.T, dir string) {
	if err := Unmount(dir); err != nil {
		if err2 := unix.Unmount(dir, unix.MNT_DETACH); err2 != nil && !errors.Is(err2, unix.EINVAL) {
			t.Errorf("unmount %s: %v / %v", dir, err, err2)
		}
	}
}

// makeRootfs writes a small template root filesystem at dir: directories,
// files (one setuid, one hard-linked twice), a symlink, a FIFO and a
// device node, owned by the shifted root except /home/user.
func makeRootfs(t *testing.T, dir string) {
	t.Helper()
	shift := storage.DefaultIDShift
	for _, d := range []string{"etc", "usr/bin", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{"etc/hello": "hello\n", "usr/bin/tool": "#!/bin/sh\n", "usr/bin/suid": "s"}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(dir, "usr/bin/tool"), filepath.Join(dir, "usr/bin/tool2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("hello", filepath.Join(dir, "etc/link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "dev/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(dir, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if err := storage.PrepareUserDirs(dir, shift); err != nil {
		t.Fatal(err)
	}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == filepath.Join(dir, "home/user") {
			return err
		}
		return os.Lchown(p, shift.UID(0), shift.GID(0))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(dir, "usr/bin/suid"), 0o4755); err != nil {
		t.Fatal(err)
	}
}

// writeFile writes n bytes of b to path and fsyncs it.
func writeFile(path string, n int, b byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = b
	}
	for n > 0 {
		k := min(n, len(buf))
		if _, err := f.Write(buf[:k]); err != nil {
			f.Close()
			return err
		}
		n -= k
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tamper changes a file inside snapshot snapID behind the driver's back:
// it clears the read-only flag, appends to a file, and sets it again.
func tamper(t *testing.T, d *Driver, snapID string) {
	t.Helper()
	path := d.snapPath(snapID)
	fd, err := openDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := setReadOnly(fd, false); err != nil {
		t.Fatalf("clear read-only: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(path, "etc/hello"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("tampered\n")
	f.Close()
	if err := setReadOnly(fd, true); err != nil {
		t.Fatalf("set read-only: %v", err)
	}
}
