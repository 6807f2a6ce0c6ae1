package build

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/forkbox/forkbox/errdefs"
)

// tarOf packs hdrs (a regular file's content is its Linkname when it
// has no Size: the test's shorthand) as a tar.
func tarOf(t *testing.T, hdrs []tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		var body []byte
		if h.Typeflag == tar.TypeReg {
			body, h.Linkname = []byte(h.Linkname), ""
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	return buf.Bytes()
}

// binContext packs files (name → bytes) as a Context.
func binContext(t *testing.T, files map[string][]byte) *Context {
	t.Helper()
	var hdrs []tar.Header
	for name, b := range files {
		hdrs = append(hdrs, tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Linkname: string(b)})
	}
	p := filepath.Join(t.TempDir(), "ctx.tar")
	if err := os.WriteFile(p, tarOf(t, hdrs), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := OpenContext(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// planAddOf plans the one ADD of df over c and returns its action or error.
func planAddOf(t *testing.T, df string, c *Context, allow []string) (*action, error) {
	t.Helper()
	f, err := Parse([]byte(df))
	if err != nil {
		return nil, err
	}
	r := &run{f: f, spec: Spec{Context: c, Allow: allow, SpoolDir: t.TempDir()}, lex: shell.NewLex('\\')}
	r.st.args = map[string]string{}
	t.Cleanup(r.removeSpools)
	return r.plan(context.Background(), f.Instrs[0])
}

// TestAddArchive checks ADD of local archives: a tar, plain, gzip or
// zstd, is extracted at the destination with its entries' owners and
// modes (setuid cleared, devices dropped); a gzip file that is not a tar
// and a plain file are copied as they are; an archive with a ".." name
// or an entry under its own symlink is refused, as is xz; --chmod
// applies; the key follows the archive's content.
func TestAddArchive(t *testing.T) {
	entries := []tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "pkg/", Typeflag: tar.TypeDir, Mode: 0o750, Uid: 1000, Gid: 1000},
		{Name: "pkg/run.sh", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1000, Gid: 100, Linkname: "#!/bin/sh\n"},
		{Name: "/abs.txt", Typeflag: tar.TypeReg, Mode: 0o600, Linkname: "abs"},
		{Name: "pkg/link", Typeflag: tar.TypeSymlink, Linkname: "run.sh"},
		{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666},
	}
	plain := tarOf(t, entries)
	var gz, zs bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(plain)
	zw.Close()
	ze, _ := zstd.NewWriter(&zs)
	ze.Write(plain)
	ze.Close()
	var gzText bytes.Buffer
	zw = gzip.NewWriter(&gzText)
	zw.Write([]byte("just text"))
	zw.Close()
	c := binContext(t, map[string][]byte{"a.tar": plain, "a.tar.gz": gz.Bytes(), "a.tar.zst": zs.Bytes(),
		"notes.gz": gzText.Bytes(), "plain.txt": []byte("p")})
	var keys []string
	for _, src := range []string{"a.tar", "a.tar.gz", "a.tar.zst"} {
		a, err := planAddOf(t, "FROM base\nADD "+src+" /opt/\n", c, nil)
		if err != nil {
			t.Fatalf("ADD %s: %v", src, err)
		}
		got := map[string]copyTarget{}
		for _, p := range a.picks {
			got[p.to] = p
		}
		run, dir, link := got["/opt/pkg/run.sh"], got["/opt/pkg"], got["/opt/pkg/link"]
		if len(a.picks) != 4 || run.e == nil || run.e.Mode != 0o755 || run.e.UID != 1000 || run.e.GID != 100 || !run.archive ||
			dir.e == nil || dir.e.Mode != 0o750 || link.e == nil || link.e.Link != "run.sh" || got["/opt/abs.txt"].e == nil {
			t.Fatalf("ADD %s: picks %+v", src, got)
		}
		if b, _ := readAll(run); b != "#!/bin/sh\n" {
			t.Fatalf("ADD %s: run.sh holds %q", src, b)
		}
		keys = append(keys, a.inputs)
	}
	again, _ := planAddOf(t, "FROM base\nADD a.tar /opt/\n", c, nil)
	entries[2].Linkname = "#!/bin/sh\nexit 1\n"
	changed, _ := planAddOf(t, "FROM base\nADD a.tar /opt/\n", binContext(t, map[string][]byte{"a.tar": tarOf(t, entries)}), nil)
	if again == nil || changed == nil || again.inputs != keys[0] || changed.inputs == keys[0] {
		t.Errorf("inputs of the same archive %v, of a changed one %v, first %s: want equal, then different", again, changed, keys[0])
	}
	for src, to := range map[string]string{"notes.gz": "/opt/notes.gz", "plain.txt": "/opt/plain.txt"} {
		a, err := planAddOf(t, "FROM base\nADD "+src+" /opt/\n", c, nil)
		if err != nil || len(a.picks) != 1 || a.picks[0].to != to || a.picks[0].archive {
			t.Fatalf("ADD %s: %+v %v, want the file copied as it is", src, a, err)
		}
	}
	a, err := planAddOf(t, "FROM base\nADD --chmod=0700 --chown=user a.tar /opt\n", c, nil)
	if err != nil || a.chmod != 0o700 || a.owner != "user" || a.inputs == keys[0] {
		t.Fatalf("ADD --chmod --chown: %+v %v", a, err)
	}
	if _, err := Parse([]byte("FROM base\nADD --chmod=9 a.tar /opt\n")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ADD --chmod=9: %v, want invalid", err)
	}

	for name, hdrs := range map[string][]tar.Header{
		"dotdot": {{Name: "ok/../../etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}},
		"under a symlink": {{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "up/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}},
	} {
		bad := binContext(t, map[string][]byte{"bad.tar": tarOf(t, hdrs)})
		if _, err := planAddOf(t, "FROM base\nADD bad.tar /opt/\n", bad, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ADD of an archive with %s: %v, want refused", name, err)
		}
	}
	xz := binContext(t, map[string][]byte{"a.tar.xz": append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, make([]byte, 600)...)})
	if _, err := planAddOf(t, "FROM base\nADD a.tar.xz /opt/\n", xz, nil); err == nil || !strings.Contains(err.Error(), "xz") {
		t.Errorf("ADD of an xz archive: %v, want refused naming xz", err)
	}
}

// readAll reads a target's bytes from its source.
func readAll(t copyTarget) (string, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(t.src.Open(t.e))
	return b.String(), err
}

// TestAddURLNeedsAllow checks that an ADD of a URL with no allow-list is
// refused before any connection, naming the host; and one with an
// allow-list but no fetcher is unavailable.
func TestAddURLNeedsAllow(t *testing.T) {
	_, err := planAddOf(t, "FROM base\nADD https://files.example/x.tar.gz /opt/\n", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "files.example is not allowed") {
		t.Fatalf("ADD URL without --allow: %v", err)
	}
	f, _ := Parse([]byte("FROM base\nADD https://files.example/x /x\n"))
	r := &run{b: &Builder{}, f: f, spec: Spec{Allow: []string{"files.example:443"}}, lex: shell.NewLex('\\')}
	r.st.args = map[string]string{}
	if _, err := r.plan(context.Background(), f.Instrs[0]); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("ADD URL without a fetcher: %v, want unavailable", err)
	}
}

// TestBatched checks that a finishing command over many paths is split
// into commands below the script bound that cover every path in order.
func TestBatched(t *testing.T) {
	var words []string
	for i := range 20000 {
		words = append(words, quote("/opt/app/node_modules/pkg/file-"+strings.Repeat("x", i%40)))
	}
	cmds := batched("chown -h 1000:1000", words)
	var got []string
	for _, c := range cmds {
		if len(c) >= maxScript/2+len("chown -h 1000:1000 ")+64 || !strings.HasPrefix(c, "chown -h 1000:1000 ") {
			t.Fatalf("a command of %d bytes: %.60s", len(c), c)
		}
		got = append(got, strings.Fields(strings.TrimPrefix(c, "chown -h 1000:1000 "))...)
	}
	if len(cmds) < 2 || strings.Join(got, " ") != strings.Join(words, " ") {
		t.Fatalf("%d commands covering %d of %d paths", len(cmds), len(got), len(words))
	}
}
