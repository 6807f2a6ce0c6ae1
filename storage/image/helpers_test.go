package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testShift is the user namespace mapping the sandboxes use.
var testShift = IDShift{UIDBase: 100000, GIDBase: 100000, Size: 65536}

// testTime is the default mtime of test entries.
var testTime = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

// entry is one hand-made tar entry of a test layer.
type entry struct {
	name, link string
	typ        byte
	body       string
	mode       int64
	uid, gid   int
	mtime      time.Time
}

// fileE returns a regular file entry owned by 0:0.
func fileE(name, body string, mode int64) entry {
	return entry{name: name, typ: tar.TypeReg, body: body, mode: mode}
}

// dirE returns a directory entry owned by 0:0.
func dirE(name string, mode int64) entry { return entry{name: name, typ: tar.TypeDir, mode: mode} }

// symE returns a symlink entry name -> target.
func symE(name, target string) entry {
	return entry{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}

// linkE returns a hard link entry name -> target (an archive path).
func linkE(name, target string) entry {
	return entry{name: name, typ: tar.TypeLink, link: target, mode: 0o644}
}

// owned returns e owned by uid:gid.
func (e entry) owned(uid, gid int) entry { e.uid, e.gid = uid, gid; return e }

// at returns e with mtime t.
func (e entry) at(t time.Time) entry { e.mtime = t; return e }

// tarBytes returns an uncompressed tar stream of entries.
func tarBytes(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mt := e.mtime
		if mt.IsZero() {
			mt = testTime
		}
		hdr := &tar.Header{
			Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode,
			Uid: e.uid, Gid: e.gid, ModTime: mt, Size: int64(len(e.body)), Format: tar.FormatPAX,
		}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layerOf builds a layer from hand-made tar entries.
func layerOf(t *testing.T, entries []entry) v1.Layer {
	t.Helper()
	b := tarBytes(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf builds an image from cfg and one layer per entry list.
func imageOf(t *testing.T, cfg v1.Config, layers ...[]entry) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for _, es := range layers {
		ls = append(ls, layerOf(t, es))
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// named is an image with the reference it is stored under.
type named struct {
	ref string
	img v1.Image
}

// writeLayout writes imgs as an OCI layout in a new directory and returns it.
func writeLayout(t *testing.T, imgs ...named) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range imgs {
		var opts []layout.Option
		if n.ref != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{annotationRefName: n.ref}))
		}
		if err := p.AppendImage(n.img, opts...); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// writeDockerTar writes imgs as a `docker save` tarball and returns its path.
func writeDockerTar(t *testing.T, imgs ...named) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.tar")
	refs := map[name.Reference]v1.Image{}
	for _, n := range imgs {
		tag, err := name.NewTag(n.ref)
		if err != nil {
			t.Fatal(err)
		}
		refs[tag] = n.img
	}
	if err := tarball.MultiRefWriteToFile(path, refs); err != nil {
		t.Fatal(err)
	}
	return path
}

// tarDir packs the directory dir into a tar file and returns its path.
func tarDir(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "layout.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(strings.TrimPrefix(p, dir+"/"))
		if err := tw.WriteHeader(hdr); err != nil || !fi.Mode().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil {
			_, err = tw.Write(b)
		}
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// sources returns the image written as an OCI layout directory, a docker
// save tarball and an OCI layout tar, by format name.
func sources(t *testing.T, imgs ...named) map[string]string {
	t.Helper()
	dir := writeLayout(t, imgs...)
	return map[string]string{"oci-dir": dir, "docker-tar": writeDockerTar(t, imgs...), "oci-tar": tarDir(t, dir)}
}

// requireRoot skips the test unless it runs as root.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: Import chowns files and the tests check host ownership")
	}
}

// lstat returns the raw stat of p or fails the test.
func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

// snapshot describes every path below dir except the subtree skip: type,
// mode, owner, size, mtime, link target and content hash. For the directory
// parent (where skip is created and removed) only the type is recorded.
func snapshot(t *testing.T, dir, skip string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == skip {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if p == filepath.Dir(skip) {
			out[p] = "parent directory"
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v %v %d:%d:%d:%d:%d", fi.Mode(), fi.ModTime(), st.Uid, st.Gid, st.Nlink, st.Ino, fi.Size())
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			h := sha256.Sum256(b)
			desc += " " + hex.EncodeToString(h[:])
		}
		out[p] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// importTo imports src into a fresh rootfs inside a new temporary directory
// and returns the result, the rootfs path and the error.
func importTo(t *testing.T, src, ref string) (*Image, string, error) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	img, err := Import(context.Background(), src, ref, root, testShift)
	return img, root, err
}

// wantGone fails the test unless p does not exist.
func wantGone(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: want not to exist, got err %v", p, err)
	}
}

// wantFile fails the test unless p is a regular file holding body with
// permission bits mode owned by host uid/gid.
func wantFile(t *testing.T, p, body string, mode os.FileMode, uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Errorf("%s: %v", p, err)
		return
	}
	if !fi.Mode().IsRegular() {
		t.Errorf("%s: mode %v, want a regular file", p, fi.Mode())
		return
	}
	if got := fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky); got != mode {
		t.Errorf("%s: mode %v, want %v", p, got, mode)
	}
	if st := lstat(t, p); st.Uid != uid || st.Gid != gid {
		t.Errorf("%s: owner %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
	}
	if b, _ := os.ReadFile(p); string(b) != body {
		t.Errorf("%s: content %q, want %q", p, b, body)
	}
}
