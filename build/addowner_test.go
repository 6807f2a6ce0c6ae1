package build

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestArchiveNegativeOwner checks that an archive entry with a negative
// owner (base-256 numbers can carry one) is a 400 naming the entry, not
// a "-1:-1" handed to chown as an option that fails the step later.
func TestArchiveNegativeOwner(t *testing.T) {
	data := tarOf(t, []tar.Header{{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Uid: -1, Gid: -1, Linkname: "x", Format: tar.FormatGNU}})
	p := filepath.Join(t.TempDir(), "a.tar")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = openTar(f, "dockerfile", true)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `"f"`) || !strings.Contains(err.Error(), "owner") {
		t.Fatalf("an entry owned by -1:-1: %v, want a 400 naming it and its owner", err)
	}
}
