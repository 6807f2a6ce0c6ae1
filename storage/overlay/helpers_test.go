package overlay

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/storage"
)

// testImageBytes is the (sparse) storage image size tests use.
const testImageBytes = 2 << 30

// skipUnlessSupported skips t when the driver cannot run here.
func skipUnlessSupported(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the overlay driver needs root (loop devices, mounts)")
	}
	if err := Supported(); err != nil {
		t.Skipf("the overlay driver cannot run here: %v", err)
	}
}

// openDriver opens a driver over dir and makes sure everything mounted
// under dir (layers, layer disks, the volume) is unmounted when the test
// ends.
func openDriver(t *testing.T, dir string) *Driver {
	t.Helper()
	d, err := New(context.Background(), Options{Dir: dir, ImageBytes: testImageBytes, Shift: storage.DefaultIDShift})
	t.Cleanup(func() { cleanupVolume(t, dir) })
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d
}

// newDriver opens a driver over a fresh temporary directory with a
// template "t1" (see makeTestTemplate).
func newDriver(t *testing.T) (*Driver, string) {
	t.Helper()
	skipUnlessSupported(t)
	base := t.TempDir()
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	d := openDriver(t, filepath.Join(base, "overlay"))
	rootfs := filepath.Join(base, "template")
	makeTestTemplate(t, rootfs)
	if err := d.AddTemplate(context.Background(), "t1", rootfs, "v1"); err != nil {
		t.Fatal(err)
	}
	return d, base
}

// makeTestTemplate writes a small root filesystem owned by the shifted
// root: etc/{hello,doomed}, etc/link -> hello, usr/share/{data,doc/a,doc/b}
// and the user directories.
func makeTestTemplate(t *testing.T, rootfs string) {
	t.Helper()
	files := map[string]string{"etc/hello": "hello\n", "etc/doomed": "doomed\n",
		"usr/share/data": strings.Repeat("x", 8192), "usr/share/doc/a": "a", "usr/share/doc/b": "b"}
	for p, c := range files {
		mustWrite(t, filepath.Join(rootfs, p), c)
	}
	if err := os.Symlink("hello", filepath.Join(rootfs, "etc/link")); err != nil {
		t.Fatal(err)
	}
	if err := storage.PrepareUserDirs(rootfs, storage.DefaultIDShift); err != nil {
		t.Fatal(err)
	}
	err := filepath.Walk(rootfs, func(p string, fi os.FileInfo, err error) error {
		if err != nil || strings.HasPrefix(p, filepath.Join(rootfs, "home/user")) {
			return err
		}
		return os.Lchown(p, storage.DefaultIDShift.UID(0), storage.DefaultIDShift.GID(0))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// cleanupVolume unmounts everything mounted under dir (deepest first),
// then dir itself (its loop device goes with it: autoclear), and removes
// dir's image. It is idempotent.
func cleanupVolume(t *testing.T, dir string) {
	ms, err := mounts()
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	var points []string
	for _, m := range ms {
		if strings.HasPrefix(m.Point, dir+"/") {
			points = append(points, m.Point)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := unmount(p); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	for isMountPoint(dir) {
		if err := unmount(dir); err != nil {
			t.Errorf("cleanup: %v", err)
			break
		}
	}
	os.Remove(dir + ".img")
}

// mustWrite writes content to path, creating parent directories.
func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mustRead returns the content of path.
func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// prepare makes layer id from src (no limit) and removes it when the
// test ends; it returns the rootfs.
func prepare(t *testing.T, d *Driver, id string, src storage.Source, quota int64) string {
	t.Helper()
	rootfs, err := d.Prepare(context.Background(), id, src, quota)
	if err != nil {
		t.Fatalf("Prepare %s: %v", id, err)
	}
	t.Cleanup(func() { d.Remove(context.Background(), id) })
	return rootfs
}

// mustTime parses an RFC 3339 time or panics.
func mustTime(s string) time.Time {
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return tm
}
