package build

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/forkbox/forkbox/errdefs"
)

// TestAddSpoolBudget checks that the bytes a build's ADDs decompress
// into spool files on the host are bounded together, not each: two
// archives that each unpack within the build's size limit but together
// past it are a 413, in one ADD and across two.
func TestAddSpoolBudget(t *testing.T) {
	big := strings.Repeat("z", 600<<10)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarOf(t, []tar.Header{{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: big}}))
	zw.Close()
	c := binContext(t, map[string][]byte{"a.tar.gz": gz.Bytes(), "b.tar.gz": gz.Bytes()})
	for _, df := range []string{
		"FROM base\nADD a.tar.gz b.tar.gz /opt/\n",
		"FROM base\nADD a.tar.gz /opt/\nADD b.tar.gz /srv/\n",
	} {
		f, err := Parse([]byte(df))
		if err != nil {
			t.Fatal(err)
		}
		r := &run{f: f, spec: Spec{Context: c, SpoolDir: t.TempDir(), MaxBytes: 1 << 20}, lex: shell.NewLex('\\')}
		r.st.args = map[string]string{}
		for _, in := range f.Instrs {
			if _, err = r.plan(context.Background(), in); err != nil {
				break
			}
		}
		r.removeSpools()
		if !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("%q: two archives of 600 KiB each under a 1 MiB limit: %v, want 413", df, err)
		}
	}
}
