package image

import (
	"archive/tar"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// baseLayers is a two-layer image with every supported entry kind.
func baseLayers() [][]entry {
	t2 := time.Date(2002, 1, 1, 0, 0, 0, 0, time.UTC)
	return [][]entry{{
		dirE("etc/", 0o755).at(t2), // mtime changes again when layer 2 replaces etc/hosts
		fileE("etc/hosts", "127.0.0.1 localhost\n", 0o644),
		dirE("home/user/", 0o700).owned(1000, 1001),
		fileE("home/user/.profile", "export X=1\n", 0o600).owned(1000, 1001),
		fileE("usr/bin/tool", "#!/bin/sh\n", 0o4755|0o2000),
		dirE("tmp/", 0o1777),
		symE("bin", "usr/bin"),
		symE("home/user/hosts", "/etc/hosts").owned(1000, 1001),
		linkE("usr/bin/tool2", "usr/bin/tool"),
		{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		{name: "run/fifo", typ: tar.TypeFifo, mode: 0o644},
		fileE("/abs/file", "abs", 0o640).owned(65535, 65535),
	}, {
		fileE("etc/hosts", "overridden\n", 0o644),
		fileE("bin/fromlink", "via symlink", 0o755),
	}}
}

// baseConfig is the config of the base image.
var baseConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "FOO=bar"},
	WorkingDir: "/home/user",
	User:       "1000:1001",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
}

// TestImportFormats imports the base image from an OCI layout directory, a
// docker save tarball and an OCI layout tar and checks files, directories,
// symlinks, hard links, modes, the ownership shift, mtimes, the config round
// trip and the digest.
func TestImportFormats(t *testing.T) {
	requireRoot(t)
	img := imageOf(t, baseConfig, baseLayers()...)
	wantDigest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for format, src := range sources(t, named{"example.com/base:1", img}) {
		t.Run(format, func(t *testing.T) {
			got, root, err := importTo(t, src, "")
			if err != nil {
				t.Fatal(err)
			}
			if format == "docker-tar" {
				ti, err := tarball.ImageFromPath(src, nil)
				if err != nil {
					t.Fatal(err)
				}
				if wantDigest, err = ti.Digest(); err != nil {
					t.Fatal(err)
				}
			}
			if got.Digest != wantDigest.String() || !strings.HasPrefix(got.Digest, "sha256:") {
				t.Errorf("digest %q, want %q", got.Digest, wantDigest)
			}
			if !reflect.DeepEqual(got.Env, baseConfig.Env) || got.WorkingDir != baseConfig.WorkingDir ||
				got.User != baseConfig.User || !reflect.DeepEqual(got.Entrypoint, baseConfig.Entrypoint) ||
				!reflect.DeepEqual(got.Cmd, baseConfig.Cmd) {
				t.Errorf("config round trip: got %+v, want %+v", got, baseConfig)
			}
			if got.Layers != 2 {
				t.Errorf("layers %d, want 2", got.Layers)
			}
			wantSize := int64(0)
			for _, l := range baseLayers() {
				for _, e := range l {
					if e.typ == tar.TypeReg {
						wantSize += int64(len(e.body))
					}
				}
			}
			if got.SizeBytes != wantSize {
				t.Errorf("size %d, want %d", got.SizeBytes, wantSize)
			}
			checkBaseTree(t, root)
		})
	}
}

// checkBaseTree checks the rootfs produced from baseLayers.
func checkBaseTree(t *testing.T, root string) {
	t.Helper()
	r := func(p string) string { return filepath.Join(root, p) }
	if st := lstat(t, root); st.Uid != 100000 || st.Gid != 100000 || st.Mode&0o7777 != 0o755 {
		t.Errorf("rootfs owner %d:%d mode %o, want 100000:100000 0755", st.Uid, st.Gid, st.Mode&0o7777)
	}
	wantFile(t, r("etc/hosts"), "overridden\n", 0o644, 100000, 100000)
	wantFile(t, r("home/user/.profile"), "export X=1\n", 0o600, 101000, 101001)
	wantFile(t, r("usr/bin/tool"), "#!/bin/sh\n", 0o755, 100000, 100000) // setuid/setgid stripped
	wantFile(t, r("usr/bin/fromlink"), "via symlink", 0o755, 100000, 100000)
	wantFile(t, r("abs/file"), "abs", 0o640, 165535, 165535)
	if st := lstat(t, r("home/user")); st.Uid != 101000 || st.Gid != 101001 || st.Mode&0o7777 != 0o700 {
		t.Errorf("home/user owner %d:%d mode %o", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if st := lstat(t, r("tmp")); st.Mode&0o7777 != 0o1777 {
		t.Errorf("tmp mode %o, want 1777", st.Mode&0o7777)
	}
	if st := lstat(t, r("usr/bin")); st.Uid != 100000 || st.Mode&0o7777 != 0o755 {
		t.Errorf("implicit usr/bin owner %d mode %o", st.Uid, st.Mode&0o7777)
	}
	if l, err := os.Readlink(r("bin")); err != nil || l != "usr/bin" {
		t.Errorf("bin -> %q, %v", l, err)
	}
	if l, err := os.Readlink(r("home/user/hosts")); err != nil || l != "/etc/hosts" {
		t.Errorf("home/user/hosts -> %q, %v", l, err)
	}
	if st := lstat(t, r("home/user/hosts")); st.Uid != 101000 || st.Gid != 101001 {
		t.Errorf("symlink owner %d:%d, want 101000:101001", st.Uid, st.Gid)
	}
	a, b := lstat(t, r("usr/bin/tool")), lstat(t, r("usr/bin/tool2"))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link: inodes %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	wantGone(t, r("dev/null"))
	wantGone(t, r("run/fifo"))
	if fi, err := os.Lstat(r("home/user/.profile")); err != nil || !fi.ModTime().Equal(testTime) {
		t.Errorf("file mtime %v (%v), want %v", fi.ModTime(), err, testTime)
	}
	if fi, err := os.Lstat(r("home/user")); err != nil || !fi.ModTime().Equal(testTime) {
		t.Errorf("dir mtime %v (%v), want %v", fi.ModTime(), err, testTime)
	}
}

// TestImportWhiteouts checks file, directory and opaque whiteouts across
// layers, that same-layer entries survive them and that no whiteout file is
// written.
func TestImportWhiteouts(t *testing.T) {
	requireRoot(t)
	img := imageOf(t, v1.Config{}, []entry{
		fileE("a/file1", "1", 0o644), fileE("a/file2", "2", 0o644),
		fileE("b/x", "x", 0o644), fileE("b/y/z", "z", 0o644),
		fileE("c/keep", "k", 0o644), fileE("d/sub/f", "f", 0o644),
		fileE("f/lower", "l", 0o644),
	}, []entry{
		fileE("a/.wh.file1", "", 0o644),
		fileE("b/new", "n", 0o644),
		fileE("b/.wh..wh..opq", "", 0o644),
		fileE("b/after", "a", 0o644),
		fileE(".wh.c", "", 0o644),
		fileE("d/.wh.sub", "", 0o644),
		fileE(".wh.nonexistent", "", 0o644),
		fileE("e/.wh.foo", "", 0o644),
		fileE("f/mine", "m", 0o644),
		fileE(".wh.f", "", 0o644),
		fileE("g/.wh..wh.plnk", "", 0o644),
	})
	for format, src := range sources(t, named{"wh:latest", img}) {
		t.Run(format, func(t *testing.T) {
			_, root, err := importTo(t, src, "")
			if err != nil {
				t.Fatal(err)
			}
			r := func(p string) string { return filepath.Join(root, p) }
			wantGone(t, r("a/file1"))
			wantFile(t, r("a/file2"), "2", 0o644, 100000, 100000)
			wantGone(t, r("b/x"))
			wantGone(t, r("b/y"))
			wantFile(t, r("b/new"), "n", 0o644, 100000, 100000)
			wantFile(t, r("b/after"), "a", 0o644, 100000, 100000)
			wantGone(t, r("c"))
			wantGone(t, r("d/sub"))
			if fi, err := os.Stat(r("d")); err != nil || !fi.IsDir() {
				t.Errorf("d: %v", err)
			}
			wantGone(t, r("e"))
			wantFile(t, r("f/mine"), "m", 0o644, 100000, 100000) // same layer as .wh.f: stays
			wantGone(t, r("f/lower"))
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && strings.HasPrefix(d.Name(), ".wh.") {
					t.Errorf("whiteout written: %s", p)
				}
				return nil
			})
		})
	}
}
