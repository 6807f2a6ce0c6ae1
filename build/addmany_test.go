package build

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// gzTar packs hdrs (shorthand of tarOf) as a gzip-compressed tar.
func gzTar(t *testing.T, hdrs []tar.Header) []byte {
	t.Helper()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarOf(t, hdrs))
	zw.Close()
	return gz.Bytes()
}

// TestAddManyArchives checks the bounds on what a build's ADDs hold in
// the daemon while it runs: archives (each an open spool file: a glob
// over thousands of them ran the daemon out of file descriptors) at most
// maxAddSpools, and their entries (each indexed in memory) at most
// MaxContextEntries in all, as one archive's are; past either a 400.
func TestAddManyArchives(t *testing.T) {
	one := gzTar(t, []tar.Header{{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}})
	files := map[string][]byte{}
	for i := range maxAddSpools + 1 {
		files[fmt.Sprintf("a%05d.tar.gz", i)] = one
	}
	_, err := planAddOf(t, "FROM base\nADD *.tar.gz /opt/\n", binContext(t, files), nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprint(maxAddSpools)) {
		t.Fatalf("ADD of %d archives: %v, want a 400 naming the bound %d", maxAddSpools+1, err, maxAddSpools)
	}

	var dirs []tar.Header
	for i := range MaxContextEntries * 6 / 10 {
		dirs = append(dirs, tar.Header{Name: fmt.Sprintf("d%06d/", i), Typeflag: tar.TypeDir, Mode: 0o755})
	}
	big := gzTar(t, dirs)
	_, err = planAddOf(t, "FROM base\nADD a.tar.gz b.tar.gz /opt/\n", binContext(t, map[string][]byte{"a.tar.gz": big, "b.tar.gz": big}), nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprint(MaxContextEntries)) {
		t.Fatalf("ADD of two archives of %d entries each: %v, want a 400 naming the bound %d", len(dirs), err, MaxContextEntries)
	}
}
