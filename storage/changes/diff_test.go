package changes

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tree writes files (path → content; a trailing "/" makes a directory,
// "->target" a symlink) under a new directory.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasSuffix(p, "/"):
			err := os.MkdirAll(full, 0o755)
			if err != nil {
				t.Fatal(err)
			}
		case strings.HasPrefix(c, "->"):
			if err := os.Symlink(c[2:], full); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func open(t *testing.T, dir string) *Tree {
	t.Helper()
	tr, err := OpenTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func TestDiff(t *testing.T) {
	common := map[string]string{"same": "x\n", "touched": "t\n", "edited": "one\n", "gone/a": "1", "gone/b/c": "2",
		"kind": "file", "link": "->/etc/passwd", "bin": "a\x00b"}
	oldDir := tree(t, common)
	// The new tree: a copy with changes (copies have new times, so
	// "same" and "touched" are compared by content).
	newFiles := map[string]string{"same": "x\n", "touched": "t\n", "edited": "two\n", "kind/inner": "in",
		"link": "->/etc/shadow", "bin": "a\x00c", "added/x.txt": "new\n"}
	newDir := tree(t, newFiles)
	later := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(newDir, "touched"), later, later)
	res, err := Diff(context.Background(), open(t, oldDir), open(t, newDir), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range res.Changes {
		got = append(got, c.Op+" "+c.Path)
	}
	want := []string{"added added", "added added/x.txt", "modified bin", "modified edited", "deleted gone", "deleted gone/a",
		"deleted gone/b", "deleted gone/b/c", "modified kind", "added kind/inner", "modified link"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("changes\n%v\nwant\n%v", got, want)
	}
	if res.Stats.Compared != 4 { // same, touched, edited, bin: equal sizes, other times
		t.Errorf("compared %d files, want 4", res.Stats.Compared)
	}
	for _, c := range res.Changes {
		switch c.Path {
		case "link":
			if c.New.Kind != KindSymlink || c.New.Target != "/etc/shadow" {
				t.Errorf("link: %+v", c.New)
			}
		case "edited":
			p, err := Patch(open(t, oldDir), open(t, newDir), c)
			if err != nil || !strings.Contains(p.Text, "-one\n+two\n") || !strings.HasPrefix(p.Text, "--- a/edited\n+++ b/edited\n") {
				t.Errorf("patch of edited: %q, %v", p.Text, err)
			}
		case "bin":
			if p, err := Patch(open(t, oldDir), open(t, newDir), c); err != nil || !p.Binary || p.Text != "" {
				t.Errorf("patch of bin: %+v, %v", p, err)
			}
		}
	}
}

// TestTreeNoFollow: reads through a tree never leave it by a symlink.
func TestTreeNoFollow(t *testing.T) {
	outside := tree(t, map[string]string{"secret": "s"})
	dir := tree(t, map[string]string{"out": "->" + outside, "f": "->" + filepath.Join(outside, "secret")})
	tr := open(t, dir)
	if _, err := tr.ReadFile("out/secret", 100); err == nil {
		t.Fatal("read through a symlinked directory")
	}
	if _, err := tr.ReadFile("f", 100); err == nil {
		t.Fatal("read through a symlink")
	}
	if e, ok, err := tr.Lstat("f"); err != nil || !ok || e.Kind != KindSymlink {
		t.Fatalf("lstat f: %+v %v %v", e, ok, err)
	}
	if _, ok, err := tr.Lstat("out/secret"); ok || err != nil {
		t.Fatalf("lstat through a link: %v %v", ok, err)
	}
	for _, p := range []string{"/a/../b", "a//b", "/./x", "a\x00"} {
		if _, err := CleanRel("paths", p); err == nil {
			t.Errorf("CleanRel(%q) passed", p)
		}
	}
}
