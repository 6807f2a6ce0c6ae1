package overlay

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/storage"
)

// TestSnapshotReproducesView changes a layer in every way overlayfs
// records (new, changed and deleted files, a directory deleted and made
// again, symlinks, fifos, modes, owners, times, xattrs, a sparse file, a
// hard link), snapshots it and checks that a layer restored from the
// snapshot shows exactly the same tree, with reflinks and with byte
// copies.
func TestSnapshotReproducesView(t *testing.T) {
	for _, reflink := range []bool{true, false} {
		t.Run(fmt.Sprintf("reflink=%v", reflink), func(t *testing.T) {
			d, _ := newDriver(t)
			d.noReflink = !reflink
			ctx := context.Background()
			src := prepare(t, d, "src", storage.Source{Template: "t1"}, 0)
			changeEverything(t, src)
			info, err := d.Snapshot(ctx, "src", "s1", nil)
			if err != nil {
				t.Fatal(err)
			}
			layer := d.snapLayer("s1")
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(layer, "etc/doomed"), &st); err != nil ||
				st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
				t.Fatalf("etc/doomed in the snapshot is not a whiteout (mode %o rdev %d, %v)", st.Mode, st.Rdev, err)
			}
			if v, err := getXattr(filepath.Join(layer, "usr/share/doc"), "trusted.overlay.opaque"); err != nil || string(v) != "y" {
				t.Fatalf("usr/share/doc in the snapshot is not opaque (%q, %v)", v, err)
			}
			if err := unix.Lstat(filepath.Join(layer, "home/user/sparse"), &st); err != nil || st.Blocks*512 > 1<<20 {
				t.Fatalf("the sparse file takes %d bytes in the snapshot (%v)", st.Blocks*512, err)
			}
			if info.SizeBytes <= 0 || info.SizeBytes > 8<<20 {
				t.Fatalf("snapshot size %d bytes", info.SizeBytes)
			}
			restored := prepare(t, d, "restored", storage.Source{Snapshot: "s1"}, 0)
			want, got := describeTree(t, src), describeTree(t, restored)
			if want != got {
				t.Fatalf("the restored layer differs from the snapshotted one:\n%s", diffLines(want, got))
			}
		})
	}
}

// TestCopyReflinks checks that the copier clones file data on XFS (and
// copies bytes when told not to), and leaves out the overlay attributes
// that tie an upper directory to its mount.
func TestCopyReflinks(t *testing.T) {
	d, _ := newDriver(t)
	src := filepath.Join(d.dir, "tmp", "src")
	mustWrite(t, filepath.Join(src, "a/file"), strings.Repeat("data", 1<<16))
	if err := unix.Lsetxattr(filepath.Join(src, "a"), "trusted.overlay.origin", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(filepath.Join(src, "a"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	for _, noReflink := range []bool{false, true} {
		c := copier{ctx: context.Background(), noReflink: noReflink}
		dst := filepath.Join(d.dir, "tmp", fmt.Sprintf("dst-%v", noReflink))
		if err := c.copyTree(src, dst); err != nil {
			t.Fatal(err)
		}
		if noReflink && (c.Copied != 1 || c.Reflinked != 0) || !noReflink && (c.Reflinked != 1 || c.Copied != 0) {
			t.Fatalf("noReflink=%v: %d files reflinked, %d copied", noReflink, c.Reflinked, c.Copied)
		}
		if mustRead(t, filepath.Join(dst, "a/file")) != strings.Repeat("data", 1<<16) {
			t.Fatal("copied content differs")
		}
		if _, err := getXattr(filepath.Join(dst, "a"), "trusted.overlay.origin"); err == nil {
			t.Fatal("trusted.overlay.origin was copied")
		}
		if v, err := getXattr(filepath.Join(dst, "a"), "trusted.overlay.opaque"); err != nil || string(v) != "y" {
			t.Fatalf("trusted.overlay.opaque: %q, %v", v, err)
		}
	}
}

// changeEverything modifies the layer at root in every way the tests
// check.
func changeEverything(t *testing.T, root string) {
	t.Helper()
	p := func(s string) string { return filepath.Join(root, s) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, p("home/user/new"), "new file")
	mustWrite(t, p("etc/hello"), "changed\n")
	must(os.Remove(p("etc/doomed")))
	must(os.RemoveAll(p("usr/share/doc")))
	mustWrite(t, p("usr/share/doc/c"), "c only")
	must(os.Symlink("../new", p("home/user/link")))
	must(os.Remove(p("etc/link")))
	must(os.Symlink("/nowhere", p("etc/link")))
	must(unix.Mkfifo(p("home/user/fifo"), 0o640))
	must(os.Chmod(p("usr/share/data"), 0o600))
	must(os.Lchown(p("home/user/new"), 101000, 101001))
	must(os.Chmod(p("home/user/new"), 0o4750))
	must(os.Mkdir(p("home/user/sticky"), 0o1777))
	must(unix.Lsetxattr(p("home/user/new"), "user.note", []byte("kept"), 0))
	f, err := os.Create(p("home/user/sparse"))
	must(err)
	must(f.Truncate(64 << 20))
	_, err = f.WriteAt([]byte("end"), 32<<20)
	must(err)
	must(f.Close())
	must(os.Link(p("home/user/new"), p("home/user/hardlink")))
	must(os.Chtimes(p("home/user/sticky"), time0, time0))
}

// time0 is an arbitrary past time set on a directory.
var time0 = mustTime("2001-02-03T04:05:06.789Z")

// describeTree returns one line per entry under root (sorted): path,
// type and mode, owner, size, link target, modification time, user
// xattrs, and a digest of regular files' content.
func describeTree(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s %o %d:%d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" size=%d sum=%x", st.Size, sum(b))
		case unix.S_IFLNK:
			target, _ := os.Readlink(path)
			line += " -> " + target
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			line += fmt.Sprintf(" mtime=%d", st.Mtim.Nano())
		}
		names, _ := listXattrs(path)
		sort.Strings(names)
		for _, n := range names {
			if strings.HasPrefix(n, "user.") {
				v, _ := getXattr(path, n)
				line += fmt.Sprintf(" %s=%q", n, v)
			}
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// sum is a content fingerprint.
func sum(b []byte) uint32 {
	return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))
}

// diffLines lists the lines only in want (-) and only in got (+).
func diffLines(want, got string) string {
	w, g := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
	}
	var b bytes.Buffer
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}
