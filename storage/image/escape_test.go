package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
)

// escapeEnv is what an escape case may aim at: a unique name u that must
// never appear on the host, the test's directory (rootfs and canary live in
// it) and the canary directory beside the rootfs.
type escapeEnv struct {
	u, tmp, canary string
}

// escapeCase is one attack: layers built from env, whether Import must fail,
// and an optional check of where the write landed inside the rootfs.
type escapeCase struct {
	name    string
	layers  func(e escapeEnv) [][]entry
	wantErr bool
	inside  func(t *testing.T, root string, e escapeEnv)
}

// up is a relative path climbing far above any rootfs.
const up = "../../../../../../../../../../"

// escapeCases are the attacks TestImportEscapes runs in every source format.
var escapeCases = []escapeCase{
	{name: "dotdot-name", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{fileE("../"+e.u, "x", 0o644)}}
	}},
	{name: "deep-dotdot-tmp", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{fileE(up+"tmp/"+e.u, "x", 0o644)}}
	}},
	{name: "dotdot-in-middle", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{dirE("a/", 0o755), fileE("a/../../"+e.u, "x", 0o644)}}
	}},
	{name: "absolute-name", layers: func(e escapeEnv) [][]entry {
		return [][]entry{{fileE("/tmp/"+e.u+"/x", "x", 0o644), fileE(e.canary+"/victim", "pwned", 0o644)}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		wantFile(t, filepath.Join(root, "tmp", e.u, "x"), "x", 0o644, 100000, 100000)
		wantFile(t, filepath.Join(root, e.canary, "victim"), "pwned", 0o644, 100000, 100000)
	}},
	{name: "symlink-to-root-then-write", layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("etc", "/")}, {fileE("etc/"+e.u, "x", 0o644)}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		wantFile(t, filepath.Join(root, e.u), "x", 0o644, 100000, 100000)
	}},
	{name: "symlink-dotdot-same-layer", layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("x", "../../.."), fileE("x/"+e.u, "x", 0o644), dirE("x/d/", 0o777)}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		wantFile(t, filepath.Join(root, e.u), "x", 0o644, 100000, 100000)
	}},
	{name: "symlink-to-host-tmp", layers: func(e escapeEnv) [][]entry {
		return [][]entry{{dirE("tmp/", 0o1777), symE("t", "/tmp"), symE("t2", up+"tmp")}, {fileE("t/"+e.u, "x", 0o644), fileE("t2/"+e.u+"2", "y", 0o644)}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		wantFile(t, filepath.Join(root, "tmp", e.u), "x", 0o644, 100000, 100000)
		wantFile(t, filepath.Join(root, "tmp", e.u+"2"), "y", 0o644, 100000, 100000)
	}},
	{name: "symlink-to-canary-dir", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("c", e.canary)}, {fileE("c/victim", "pwned", 0o644)}}
	}},
	{name: "symlink-relative-to-canary-dir", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("c", up+strings.TrimPrefix(e.canary, "/"))}, {dirE("c/sub/", 0o777)}}
	}},
	{name: "dangling-symlink-parent", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("d", "/tmp/"+e.u)}, {fileE("d/x", "x", 0o644)}}
	}},
	{name: "symlink-loop-parent", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("a", "b"), symE("b", "a"), fileE("a/"+e.u, "x", 0o644)}}
	}},
	{name: "hardlink-dotdot", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{linkE("shadow", "../../etc/shadow")}}
	}},
	{name: "hardlink-absolute-host-file", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{linkE("passwd", "/etc/passwd"), linkE("victim", e.canary+"/victim")}}
	}},
	{name: "hardlink-via-symlinked-dir", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("hostetc", "/etc"), symE("canary", up+strings.TrimPrefix(e.canary, "/"))},
			{linkE("p", "hostetc/passwd"), linkE("v", "canary/victim")}}
	}},
	{name: "hardlink-via-symlink-stays-inside", layers: func(e escapeEnv) [][]entry {
		return [][]entry{{fileE("etc/passwd", "inside", 0o644), symE("e", up+"etc")}, {linkE("p", "e/passwd")}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		a, b := lstat(t, filepath.Join(root, "p")), lstat(t, filepath.Join(root, "etc/passwd"))
		if a.Ino != b.Ino {
			t.Errorf("hard link p is not root/etc/passwd")
		}
		wantFile(t, filepath.Join(root, "p"), "inside", 0o644, 100000, 100000)
	}},
	{name: "hardlink-to-symlink", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("s", "/etc/passwd"), linkE("h", "s")}}
	}},
	{name: "hardlink-to-dir", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{dirE("d/", 0o755), linkE("h", "d")}}
	}},
	{name: "whiteout-through-symlink", layers: func(e escapeEnv) [][]entry {
		rel := up + strings.TrimPrefix(e.canary, "/")
		return [][]entry{{symE("c", e.canary), symE("d", rel), symE("t", "/tmp")}, {
			fileE("c/.wh.victim", "", 0o644), fileE("d/.wh.victim", "", 0o644),
			fileE("c/.wh..wh..opq", "", 0o644), fileE("d/.wh..wh..opq", "", 0o644),
			fileE("t/.wh."+filepath.Base(e.tmp), "", 0o644),
		}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		if _, err := os.Lstat(filepath.Join(root, "c")); err != nil {
			t.Errorf("symlink c itself should stay: %v", err)
		}
	}},
	{name: "whiteout-dotdot", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{fileE("a", "a", 0o644)}, {fileE("../canary/.wh.victim", "", 0o644)}}
	}},
	{name: "whiteout-dotdot-target", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{fileE("a/b", "a", 0o644)}, {fileE("a/.wh..", "", 0o644)}}
	}},
	{name: "whiteout-dot-target", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{fileE("a/b", "a", 0o644)}, {fileE("a/.wh.", "", 0o644)}}
	}},
	{name: "opaque-root-stays-inside", layers: func(e escapeEnv) [][]entry {
		return [][]entry{{fileE("a", "a", 0o644), symE("up", up)}, {fileE(".wh..wh..opq", "", 0o644), fileE("b", "b", 0o644)}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		wantGone(t, filepath.Join(root, "a"))
		wantGone(t, filepath.Join(root, "up"))
		wantFile(t, filepath.Join(root, "b"), "b", 0o644, 100000, 100000)
	}},
	{name: "replace-symlink-with-file", layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("f", "/tmp/"+e.u), symE("v", e.canary+"/victim")}, {fileE("f", "x", 0o644), fileE("v", "pwned", 0o600)}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		wantFile(t, filepath.Join(root, "f"), "x", 0o644, 100000, 100000)
		wantFile(t, filepath.Join(root, "v"), "pwned", 0o600, 100000, 100000)
	}},
	{name: "replace-symlink-with-dir", layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("d", e.canary)}, {dirE("d/", 0o777).owned(5, 5)}}
	}, inside: func(t *testing.T, root string, e escapeEnv) {
		if st := lstat(t, filepath.Join(root, "d")); st.Mode&0o170000 != 0o040000 || st.Uid != 100005 {
			t.Errorf("d: mode %o uid %d, want a directory owned by 100005", st.Mode, st.Uid)
		}
	}},
	{name: "symlink-named-like-root", wantErr: true, layers: func(e escapeEnv) [][]entry {
		return [][]entry{{symE("./", "/tmp")}}
	}},
}

// TestImportEscapes imports each escape case from each source format beside a
// canary directory and checks that nothing outside the rootfs changed.
func TestImportEscapes(t *testing.T) {
	requireRoot(t)
	for _, c := range escapeCases {
		t.Run(c.name, func(t *testing.T) {
			for _, format := range []string{"oci-dir", "docker-tar", "oci-tar"} {
				tmp := t.TempDir()
				env := escapeEnv{
					u:      fmt.Sprintf("forkbox-escape-%d-%d", os.Getpid(), time.Now().UnixNano()),
					tmp:    tmp,
					canary: filepath.Join(tmp, "canary"),
				}
				img := imageOf(t, v1.Config{}, c.layers(env)...)
				runEscape(t, format, c, env, sources(t, named{"evil:1", img})[format])
			}
		})
	}
}

// runEscape imports src (case c, format format) into env.tmp/rootfs beside
// a canary directory and checks that nothing outside the rootfs changed.
func runEscape(t *testing.T, format string, c escapeCase, env escapeEnv, src string) {
	t.Helper()
	root := filepath.Join(env.tmp, "rootfs")
	if err := os.MkdirAll(env.canary, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(env.canary, "victim"), []byte("precious"), 0o640)
	hostPasswd := lstat(t, "/etc/passwd")
	before := snapshot(t, filepath.Dir(env.tmp), root)

	_, err := Import(context.Background(), src, "", root, testShift)
	t.Logf("%s: %v", format, err)
	switch {
	case c.wantErr && !errors.Is(err, errdefs.ErrInvalidArgument):
		t.Errorf("%s: err %v, want invalid argument", format, err)
	case c.wantErr:
		wantGone(t, root)
	case err != nil:
		t.Errorf("%s: unexpected error %v", format, err)
	case c.inside != nil:
		c.inside(t, root, env)
	}

	if after := snapshot(t, filepath.Dir(env.tmp), root); !reflect.DeepEqual(before, after) {
		for p, d := range after {
			if before[p] != d {
				t.Errorf("%s: outside rootfs changed: %s: %q -> %q", format, p, before[p], d)
			}
		}
		for p := range before {
			if _, ok := after[p]; !ok {
				t.Errorf("%s: outside rootfs removed: %s", format, p)
			}
		}
	}
	if b, _ := os.ReadFile(filepath.Join(env.canary, "victim")); string(b) != "precious" {
		t.Errorf("%s: canary changed: %q", format, b)
	}
	for _, d := range []string{"/", "/tmp", os.TempDir(), "/etc", env.tmp, filepath.Dir(env.tmp), filepath.Dir(filepath.Dir(env.tmp))} {
		for _, n := range []string{env.u, env.u + "2"} {
			wantGone(t, filepath.Join(d, n))
		}
	}
	if now := lstat(t, "/etc/passwd"); now.Nlink != hostPasswd.Nlink || now.Ino != hostPasswd.Ino || now.Mtim != hostPasswd.Mtim {
		t.Errorf("%s: host /etc/passwd changed", format)
	}
	os.RemoveAll(root)
}
