package tartree

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestWrite proves directories, files (with content) and symlinks are
// written with relative names, and other file types are skipped.
func TestWrite(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "d/e"), 0o755)
	os.WriteFile(filepath.Join(root, "d/f.txt"), []byte("content"), 0o644)
	os.Symlink("f.txt", filepath.Join(root, "d/link"))
	var buf bytes.Buffer
	if err := Write(&buf, root); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[hdr.Name] = string(b) + hdr.Linkname
	}
	want := map[string]string{"d/": "", "d/e/": "", "d/f.txt": "content", "d/link": "f.txt"}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}
