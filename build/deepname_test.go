package build

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// TestContextDeepName checks that an entry whose name is far longer than
// a path can be (PATH_MAX, 4096 bytes) is refused at once: each of its
// hundreds of thousands of components would otherwise be made a parent
// directory entry, in time quadratic in the name's length, past the
// entry bound that is checked once per header.
func TestContextDeepName(t *testing.T) {
	name := strings.Repeat("a/", 300_000) + "f"
	data := tarOf(t, []tar.Header{{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x", Format: tar.FormatPAX}})
	p := filepath.Join(t.TempDir(), "ctx.tar")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, archive := range []bool{false, true} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := openTar(f, "context", archive); done <- err }()
		select {
		case err = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("archive %t: a %d-byte entry name is still being indexed after 20 s", archive, len(name))
		}
		f.Close()
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "long") {
			t.Fatalf("archive %t: a %d-byte entry name: %v, want a 400 saying it is too long", archive, len(name), err)
		}
	}
}
