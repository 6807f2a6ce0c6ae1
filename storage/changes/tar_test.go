package changes

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

var base = map[string]string{
	"etc/keep":      "same",
	"etc/edit":      "old text",
	"etc/gone":      "bye",
	"old/a/b":       "deep",
	"old/c":         "c",
	"swap":          "a file that becomes a directory",
	"dir2file/x":    "x",
	"link":          "->etc/keep",
	"home/user/.rc": "rc",
}

// TestTarRoundTrip proves a change archive from a base tree to a tree,
// applied to another copy of the base, makes that copy the tree again:
// added, edited and deleted files, a deleted directory with its contents,
// kind changes both ways, symlinks, a FIFO, owners, modes and times.
func TestTarRoundTrip(t *testing.T) {
	ctx := context.Background()
	newDir := tree(t, base)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(newDir, "etc/edit"), []byte("new text, longer"), 0o640))
	must(os.Remove(filepath.Join(newDir, "etc/gone")))
	must(os.RemoveAll(filepath.Join(newDir, "old")))
	must(os.Remove(filepath.Join(newDir, "swap")))
	must(os.MkdirAll(filepath.Join(newDir, "swap/inner"), 0o750))
	must(os.WriteFile(filepath.Join(newDir, "swap/inner/f"), bytes.Repeat([]byte("z"), 3<<20), 0o600))
	must(os.RemoveAll(filepath.Join(newDir, "dir2file")))
	must(os.WriteFile(filepath.Join(newDir, "dir2file"), []byte("now a file"), 0o755))
	must(os.Chmod(filepath.Join(newDir, "dir2file"), 0o755|os.ModeSetuid))
	must(os.Remove(filepath.Join(newDir, "link")))
	must(os.Symlink("/nowhere", filepath.Join(newDir, "link")))
	must(unix.Mkfifo(filepath.Join(newDir, "home/user/fifo"), 0o600))
	must(os.Lchown(filepath.Join(newDir, "home/user/.rc"), 101000, 101000))
	must(os.Chmod(filepath.Join(newDir, "home/user/.rc"), 0o600))

	d, err := Diff(ctx, open(t, tree(t, base)), open(t, newDir), Options{})
	must(err)
	var buf bytes.Buffer
	must(WriteTar(ctx, &buf, open(t, newDir), d.Changes))

	target := tree(t, base)
	must(ApplyTar(ctx, &buf, open(t, target), ApplyOptions{}))
	again, err := Diff(ctx, open(t, target), open(t, newDir), Options{})
	must(err)
	for _, c := range again.Changes {
		t.Errorf("after apply, still %s: %s", c.Op, c.Path)
	}
	fi, err := os.Stat(filepath.Join(target, "dir2file"))
	must(err)
	if fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("setuid bit lost: %v", fi.Mode())
	}
}

// TestApplyTarStaysBeneath proves entries cannot reach outside the tree:
// a name with "..", and a path through a symlink the base holds (its
// target outside), are refused and nothing outside changes.
func TestApplyTarStaysBeneath(t *testing.T) {
	ctx := context.Background()
	outside := t.TempDir()
	for _, name := range []string{"../escape", "esc/owned"} {
		target := tree(t, map[string]string{"esc": "->" + outside})
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte("x"))
		tw.Close()
		err := ApplyTar(ctx, &buf, open(t, target), ApplyOptions{})
		if err == nil {
			t.Errorf("%s: applied", name)
		}
		if name == "../escape" && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
		if des, _ := os.ReadDir(outside); len(des) != 0 {
			t.Fatalf("%s: wrote outside the tree: %v", name, des)
		}
	}
}

// TestApplyTarRefusesPrivilege proves an archive cannot plant a device
// node or a setuid file of a host-privileged owner: the device is
// refused, the setuid bit of a root-owned file dropped (one of a
// sandbox-owned file kept).
func TestApplyTarRefusesPrivilege(t *testing.T) {
	ctx := context.Background()
	entry := func(h *tar.Header, body string) *bytes.Buffer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
		tw.Close()
		return &buf
	}
	opts := ApplyOptions{PrivilegedBelow: 100000}
	target := tree(t, map[string]string{"etc/": ""})
	for _, h := range []*tar.Header{
		{Name: "disk", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o666},
		{Name: "mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666},
	} {
		if err := ApplyTar(ctx, entry(h, ""), open(t, target), opts); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want refused", h.Name, err)
		}
		if _, err := os.Lstat(filepath.Join(target, h.Name)); err == nil {
			t.Errorf("%s was made", h.Name)
		}
	}
	for name, uid := range map[string]int{"rootsh": 0, "usersh": 101000} {
		h := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o4755, Uid: uid, Gid: uid}
		if err := ApplyTar(ctx, entry(h, "#!/bin/sh"), open(t, target), opts); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(target, name))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fi.Mode()&os.ModeSetuid != 0, uid != 0; got != want {
			t.Errorf("%s (uid %d): setuid %v, want %v", name, uid, got, want)
		}
	}
}

// TestWriteTarBoundsAmplification proves a tree cannot make an archive
// far larger than its disk use: a sparse file of 4 GiB, and one small
// file under many hard links, are ErrResourceExhausted before their
// contents are read; a modest tree of both still archives.
func TestWriteTarBoundsAmplification(t *testing.T) {
	ctx := context.Background()
	archive := func(dir string) error {
		t.Helper()
		d, err := Diff(ctx, open(t, tree(t, map[string]string{"etc/keep": "same"})), open(t, dir), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return WriteTar(ctx, io.Discard, open(t, dir), d.Changes)
	}
	sparse := tree(t, map[string]string{"etc/keep": "same"})
	f, err := os.Create(filepath.Join(sparse, "hole"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(4 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := archive(sparse); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("archive of a 4 GiB sparse file: %v, want ErrResourceExhausted", err)
	}

	links := tree(t, map[string]string{"etc/keep": "same", "big": strings.Repeat("x", 1<<20)})
	for i := range 100 {
		if err := os.Link(filepath.Join(links, "big"), filepath.Join(links, fmt.Sprintf("l%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := archive(links); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("archive of a 1 MiB file under 101 names: %v, want ErrResourceExhausted", err)
	}

	modest := tree(t, map[string]string{"etc/keep": "same", "big": strings.Repeat("x", 1<<20)})
	for i := range 3 {
		if err := os.Link(filepath.Join(modest, "big"), filepath.Join(modest, fmt.Sprintf("l%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	g, err := os.Create(filepath.Join(modest, "hole"))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Truncate(8 << 20); err != nil {
		t.Fatal(err)
	}
	g.Close()
	if err := archive(modest); err != nil {
		t.Fatalf("archive of a few links and a small sparse file: %v", err)
	}
}
