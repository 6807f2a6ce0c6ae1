package e2e

import (
	"archive/tar"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestTemplateBuildAddDashLinks proves that an ADD archive's symlinks
// whose targets begin with "-" are made with those targets, not read as
// options of the ln that makes them: "-x" is a link to "-x", and
// "--target-directory=/tmp" a link to that name, with no link made in
// /tmp.
func TestTemplateBuildAddDashLinks(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 10*time.Minute)
	dir := t.TempDir()
	ar := gzipTar(t, []tar.Header{
		{Name: "dash", Typeflag: tar.TypeSymlink, Linkname: "-x"},
		{Name: "opt", Typeflag: tar.TypeSymlink, Linkname: "--target-directory=/tmp"},
	}, nil)
	if err := os.WriteFile(filepath.Join(dir, "links.tar.gz"), ar, 0o644); err != nil {
		t.Fatal(err)
	}
	name := tplName("add-dash")
	deleteTemplateAtEnd(t, env.c, name)
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	if _, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: "FROM base\nADD links.tar.gz /opt/l/\n"},
		client.BuildOptions{ContextDir: dir}); err != nil {
		t.Fatalf("build: %v", err)
	}
	s := newSession(t, client.CreateRequest{Template: name, User: "root"})
	out := sh(t, s.ID, `readlink /opt/l/dash /opt/l/opt; ls -A /tmp`)
	if want := "-x\n--target-directory=/tmp\n"; out != want {
		t.Fatalf("the archive's links and /tmp:\n%q\nwant:\n%q", out, want)
	}
}
