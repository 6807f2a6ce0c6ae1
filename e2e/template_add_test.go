package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testnet"
)

// addFilesHost is the test host TestTemplateBuildAddURL downloads from
// (files.test).
const addFilesHost = "198.51.100.50"

func init() {
	egressNames["files.test"] = []netip.Addr{netip.MustParseAddr(addFilesHost)}
}

// gzipTar packs hdrs as a gzip-compressed tar; a regular file's content
// is bodies[name].
func gzipTar(t *testing.T, hdrs []tar.Header, bodies map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range hdrs {
		h.Size = int64(len(bodies[h.Name]))
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(bodies[h.Name]))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// TestTemplateBuildAddArchive proves an ADD of a tar.gz from the context
// is extracted at its destination with the archive's owners, modes and
// symlinks (setuid cleared, a device node dropped), that --chown owns
// every entry instead, and that an archive with a name leaving the
// destination fails the build with a 400 naming the line and the entry
// and registers nothing.
func TestTemplateBuildAddArchive(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 10*time.Minute)
	dir := t.TempDir()
	app := gzipTar(t, []tar.Header{
		{Name: "pkg/", Typeflag: tar.TypeDir, Mode: 0o750, Uid: 1000, Gid: 1000},
		{Name: "pkg/run.sh", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1000, Gid: 100},
		{Name: "pkg/link", Typeflag: tar.TypeSymlink, Linkname: "run.sh", Uid: 1000, Gid: 1000},
		{Name: "top.txt", Typeflag: tar.TypeReg, Mode: 0o600},
		{Name: "dev/zero", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 5},
	}, map[string]string{"pkg/run.sh": "#!/bin/sh\necho run\n", "top.txt": "top\n"})
	bad := gzipTar(t, []tar.Header{{Name: "ok/../../escape.txt", Typeflag: tar.TypeReg, Mode: 0o644}}, map[string]string{"ok/../../escape.txt": "x"})
	for name, b := range map[string][]byte{"app.tar.gz": app, "bad.tar.gz": bad} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	name := tplName("add-archive")
	deleteTemplateAtEnd(t, env.c, name)
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	df := "FROM base\nADD app.tar.gz /opt/app/\nADD --chown=user app.tar.gz /opt/mine\n"
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: df}, client.BuildOptions{ContextDir: dir})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if res.Sandboxes != 1 || len(res.Steps) != 2 {
		t.Fatalf("build result %+v", res)
	}
	if info, err := env.c.Info(ctx); err != nil || res.Template.Tier != info.DefaultDriver {
		t.Errorf("the built template's tier %q, want the default driver's (%v)", res.Template.Tier, err)
	}
	s := newSession(t, client.CreateRequest{Template: name, User: "root"})
	out := sh(t, s.ID, `cd /opt/app && stat -c '%n %a %u:%g %F' pkg pkg/run.sh top.txt && readlink pkg/link && cat pkg/run.sh top.txt && ls -A /opt/app; `+
		`cd /opt/mine && stat -c '%n %a %U' pkg pkg/run.sh top.txt`)
	want := "pkg 750 1000:1000 directory\npkg/run.sh 755 1000:100 regular file\ntop.txt 600 0:0 regular file\n" +
		"run.sh\n#!/bin/sh\necho run\ntop\npkg\ntop.txt\n" +
		"pkg 750 user\npkg/run.sh 755 user\ntop.txt 600 user\n"
	if out != want {
		t.Fatalf("the extracted archive:\n%s\nwant:\n%s", out, want)
	}

	escape := tplName("add-escape")
	deleteBuildSnapshotsAtEnd(t, env.c, escape)
	_, err = env.c.BuildTemplate(ctx, escape, client.BuildRequest{Dockerfile: "FROM base\nRUN true\nADD bad.tar.gz /opt/\n"}, client.BuildOptions{ContextDir: dir})
	if problemStatus(err) != 400 || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "escape.txt") {
		t.Fatalf("a path-escaping archive: %v, want a 400 naming line 3 and the entry", err)
	}
	if ts, _ := env.c.Templates(ctx); hasTemplate(ts, escape) {
		t.Error("a build with a refused archive registered its template")
	}
	wantNoPartials(t)
}

// TestTemplateBuildAddURL proves an ADD of a URL is downloaded by the
// daemon through the build's egress allow-list: allowed, the file lands
// with mode 0600 and a rebuild is cached while the served bytes stay the
// same and not once they change (the download's digest is in the
// step's key); with no allow-list, or one that does not name the host,
// the build is a 400 naming the line and the host, and nothing is
// registered; a tenant's allow-list outside its egress ceiling is a 403.
func TestTemplateBuildAddURL(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 10*time.Minute)
	host := testnet.NewHost(t, addFilesHost)
	var version atomic.Int32
	version.Store(1)
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tool.txt" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "tool v%d\n", version.Load())
	}))
	df := "FROM base\nADD http://files.test/tool.txt /opt/\nRUN cat /opt/tool.txt > /opt/copy.txt\n"
	allow := []string{"files.test:80"}

	name := tplName("add-url")
	deleteTemplateAtEnd(t, env.c, name)
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	if _, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: df, Allow: allow}, client.BuildOptions{}); err != nil {
		t.Fatalf("build: %v", err)
	}
	s := newSession(t, client.CreateRequest{Template: name, User: "root"})
	if out := sh(t, s.ID, "stat -c '%a %u' /opt/tool.txt && cat /opt/tool.txt /opt/copy.txt"); out != "600 0\ntool v1\ntool v1\n" {
		t.Fatalf("the downloaded file: %q", out)
	}

	same := tplName("add-url-same")
	deleteTemplateAtEnd(t, env.c, same)
	res, err := env.c.BuildTemplate(ctx, same, client.BuildRequest{Dockerfile: df, Allow: allow}, client.BuildOptions{})
	if err != nil || res.Sandboxes != 0 {
		t.Fatalf("rebuild with the same download: %+v %v, want fully cached", res, err)
	}
	version.Store(2)
	changed := tplName("add-url-changed")
	deleteTemplateAtEnd(t, env.c, changed)
	deleteBuildSnapshotsAtEnd(t, env.c, changed)
	res, err = env.c.BuildTemplate(ctx, changed, client.BuildRequest{Dockerfile: df, Allow: allow}, client.BuildOptions{})
	if err != nil || res.Sandboxes != 1 || res.Steps[0].Cached {
		t.Fatalf("rebuild with a changed download: %+v %v, want the ADD run again", res, err)
	}
	s2 := newSession(t, client.CreateRequest{Template: changed})
	if out := sh(t, s2.ID, "cat /opt/copy.txt"); out != "tool v2\n" {
		t.Fatalf("the changed download: %q", out)
	}

	for doc, allowed := range map[string][]string{"no allow-list": nil, "another host": {"other.test:80"}} {
		refused := tplName("add-url-refused")
		deleteBuildSnapshotsAtEnd(t, env.c, refused)
		_, err := env.c.BuildTemplate(ctx, refused, client.BuildRequest{Dockerfile: df, Allow: allowed}, client.BuildOptions{})
		if problemStatus(err) != 400 || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "files.test") {
			t.Errorf("%s: %v, want a 400 naming line 2 and files.test", doc, err)
		}
		if ts, _ := env.c.Templates(ctx); hasTemplate(ts, refused) {
			t.Errorf("%s: the refused build registered its template", doc)
		}
	}

	// A tenant's build keeps its allow-list within the tenant's egress
	// ceiling, before anything is downloaded.
	_, _, tc := newTenant(t, env.c, "addurl", client.TenantPolicy{EgressAllow: []string{"other.test:80"}})
	_, err = tc.BuildTemplate(ctx, tplName("add-url-tenant"), client.BuildRequest{Dockerfile: df, Allow: allow}, client.BuildOptions{})
	if problemStatus(err) != http.StatusForbidden || errProblem(err) != "egress-not-allowed" || !strings.Contains(err.Error(), "files.test:80") {
		t.Errorf("a tenant's build outside its egress ceiling: %v, want 403 egress-not-allowed naming the entry", err)
	}
	wantNoPartials(t)
}
