package loop

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needLoop skips t when this process cannot attach loop devices (not
// root, or a host without them), saying why.
func needLoop(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	if err := Supported(); err != nil {
		t.Skipf("no loop devices here: %v", err)
	}
}

// newFile makes a 16 MiB image file with its blocks reserved in a fresh
// temporary directory and returns its path.
func newFile(t *testing.T) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := CreateImage(img, 16<<20, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return img
}

// attachT attaches img with setup and registers the device's release:
// closed, and detached outright should the test fail before autoclear did
// it, so no device outlives the test.
func attachT(t *testing.T, img string, o Options, setup setupFunc) *Device {
	t.Helper()
	d, err := attach(img, o, setup)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		if s, err := GetStatus(d.Path()); err == nil && s.BackingInode == inode(t, img) {
			Detach(d.Path())
		}
	})
	return d
}

// inode returns the inode number of path (0 once it is gone).
func inode(t *testing.T, path string) uint64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

// waitDetached fails t unless no loop device is bound to img within a
// generous hang guard (autoclear may finish after the last close returned).
func waitDetached(t *testing.T, img string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		devs, err := Find(img)
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still bound to %v", img, devs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAttach proves both ways of binding a device (LOOP_CONFIGURE, and
// the LOOP_SET_FD + LOOP_SET_STATUS64 fallback forced here) bind the
// file with autoclear, direct I/O only when asked for, so that Find sees
// the device and closing it detaches it.
func TestAttach(t *testing.T) {
	needLoop(t)
	for _, c := range []struct {
		name  string
		setup setupFunc
	}{{"configure", configure}, {"legacy", legacySetup}} {
		for _, dio := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/directio=%v", c.name, dio), func(t *testing.T) {
				img := newFile(t)
				d := attachT(t, img, Options{DirectIO: dio}, c.setup)
				s, err := GetStatus(d.Path())
				if err != nil {
					t.Fatal(err)
				}
				if !s.Autoclear() || s.BackingInode != inode(t, img) {
					t.Fatalf("status %+v: want autoclear, backing inode %d", s, inode(t, img))
				}
				// The test's files are on a disk filesystem, which allows
				// direct I/O; a host filesystem that refused it would have
				// given buffered I/O without an error.
				if !dio && s.DirectIO() {
					t.Fatalf("direct I/O set without being asked for: %+v", s)
				}
				if dio && !s.DirectIO() && allowsDirectIO(img) {
					t.Fatalf("direct I/O asked for on a filesystem that allows it, not set: %+v", s)
				}
				devs, err := Find(img)
				if err != nil || len(devs) != 1 || devs[0] != d.Path() {
					t.Fatalf("Find(%s) = %v, %v; want [%s]", img, devs, err, d.Path())
				}
				if err := d.Close(); err != nil {
					t.Fatal(err)
				}
				waitDetached(t, img)
			})
		}
	}
}

// allowsDirectIO reports whether the filesystem holding path opens files
// with O_DIRECT.
func allowsDirectIO(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// TestAttachMissingFile proves a missing backing file is the open error,
// not a loop device problem, and binds nothing.
func TestAttachMissingFile(t *testing.T) {
	needLoop(t)
	_, err := Attach(filepath.Join(t.TempDir(), "none.img"), Options{})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Attach of a missing file: %v; want ErrNotExist", err)
	}
}

// TestAttachConcurrent proves callers racing for free devices each get a
// device of their own.
func TestAttachConcurrent(t *testing.T) {
	needLoop(t)
	const n = 4
	imgs := make([]string, n)
	for i := range imgs {
		imgs[i] = newFile(t)
	}
	devs := make([]*Device, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			devs[i], errs[i] = Attach(imgs[i], Options{DirectIO: true})
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, d := range devs {
		if errs[i] != nil {
			t.Error(errs[i])
			continue
		}
		defer waitDetached(t, imgs[i])
		defer d.Close()
		if seen[d.Path()] {
			t.Errorf("%s handed out twice", d.Path())
		}
		seen[d.Path()] = true
	}
}

// TestDetachAndUnder proves Under finds a device by the directory of its
// file and Detach unbinds a device that has no autoclear (one another
// program bound), and does nothing to an unbound device.
func TestDetachAndUnder(t *testing.T) {
	needLoop(t)
	img := newFile(t)
	noAutoclear := func(dev, file int, name string, flags uint32) error {
		return legacySetup(dev, file, name, flags&^unix.LO_FLAGS_AUTOCLEAR)
	}
	d := attachT(t, img, Options{}, noAutoclear)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if devs, _ := Find(img); len(devs) != 1 {
		t.Fatalf("a device without autoclear went away at close: %v", devs)
	}
	if under := Under(filepath.Dir(img)); len(under) != 1 || under[0] != d.Path() {
		t.Fatalf("Under(%s) = %v; want [%s]", filepath.Dir(img), under, d.Path())
	}
	if under := Under(filepath.Dir(img) + "-other"); len(under) != 0 {
		t.Fatalf("Under of another directory = %v", under)
	}
	if err := Detach(d.Path()); err != nil {
		t.Fatal(err)
	}
	waitDetached(t, img)
	if err := Detach(d.Path()); err != nil {
		t.Fatalf("Detach of an unbound device: %v", err)
	}
}

// TestMount proves an image made by CreateImage and mounted with Mount
// holds files across a remount, and that its device goes with the
// unmount.
func TestMount(t *testing.T) {
	needLoop(t)
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs)")
	}
	img := filepath.Join(t.TempDir(), "ext4.img")
	err := CreateImage(img, 32<<20, func(tmp string) error {
		return exec.Command("mkfs.ext4", "-q", "-F", tmp).Run()
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary image left: %v", err)
	}
	dir := t.TempDir()
	for round := range 2 {
		dev, err := Mount(img, dir, "ext4", unix.MS_NODEV|unix.MS_NOSUID, "", Options{DirectIO: true})
		if err != nil {
			t.Fatal(err)
		}
		if devs, _ := Find(img); len(devs) != 1 || devs[0] != dev {
			unix.Unmount(dir, 0)
			t.Fatalf("mounted on %s, Find says %v", dev, devs)
		}
		f := filepath.Join(dir, "kept")
		if round == 0 {
			err = os.WriteFile(f, []byte("data"), 0o600)
		} else if b, rerr := os.ReadFile(f); rerr != nil || string(b) != "data" {
			err = errors.Join(rerr, errors.New("file not kept across a remount: "+string(b)))
		}
		if uerr := unix.Unmount(dir, 0); uerr != nil {
			t.Fatal(uerr)
		}
		if err != nil {
			t.Fatal(err)
		}
		waitDetached(t, img)
	}
	// A filesystem type the kernel refuses leaves nothing bound.
	if _, err := Mount(img, dir, "no-such-fs", 0, "", Options{}); !errors.Is(err, unix.ENODEV) {
		t.Fatalf("mount as an unknown filesystem: %v; want ENODEV", err)
	}
	waitDetached(t, img)
}

// TestCreateImageFailure proves a failing format leaves no file behind,
// and an existing stale temporary file does not stop a new image.
func TestCreateImageFailure(t *testing.T) {
	img := filepath.Join(t.TempDir(), "x.img")
	boom := errors.New("format failed")
	if err := CreateImage(img, 1<<20, func(string) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("CreateImage: %v; want the format's error", err)
	}
	for _, p := range []string{img, img + ".tmp"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left after a failed create: %v", p, err)
		}
	}
	if err := os.WriteFile(img+".tmp", []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CreateImage(img, 1<<20, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(img); err != nil || fi.Size() != 1<<20 {
		t.Fatalf("image after a stale temporary: %v, %v", fi, err)
	}
}
