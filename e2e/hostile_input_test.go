package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// Regression tests for bad and hostile input at the API edge: uploads and
// templates crafted to break the daemon or make it name its host paths,
// files the agent cannot size, bodies and headers outside the API's
// contract, and ids a client leaves empty.

// layerEntry is one entry of a crafted image layer.
type layerEntry struct {
	name, link string
	typ        byte
	body       []byte
}

// craftedImage returns a `docker save` tarball of a one-layer image with
// a static busybox (sh, cat, ls, echo, true) and the extra entries, PATH=/bin.
func craftedImage(t *testing.T, extra ...layerEntry) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs a static /bin/busybox (Debian busybox-static; make deps installs it)")
	}
	entries := []layerEntry{{name: "bin/", typ: tar.TypeDir}, {name: "bin/busybox", typ: tar.TypeReg, body: bb}}
	for _, applet := range []string{"sh", "cat", "ls", "echo", "true", "stat"} {
		entries = append(entries, layerEntry{name: "bin/" + applet, typ: tar.TypeSymlink, link: "busybox"})
	}
	entries = append(entries, extra...)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := int64(0o755)
		if e.typ == tar.TypeReg && e.name != "bin/busybox" {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode,
			Size: int64(len(e.body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	tw.Close()
	img := imageOfLayer(t, buf.Bytes())
	tag, _ := name.NewTag("forkbox.test/crafted:1")
	var out bytes.Buffer
	if err := tarball.Write(tag, img, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// imageOfLayer is an image of the one uncompressed tar layer, PATH=/bin.
func imageOfLayer(t *testing.T, layer []byte) ggcr.Image {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, ggcr.Config{Env: []string{"PATH=/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// tarOf packs files (name -> content) into a tar archive.
func tarOf(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for n, b := range files {
		tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))})
		tw.Write(b)
	}
	tw.Close()
	return buf.Bytes()
}

// brokenLayoutTar is an OCI image layout packed as a tar whose index
// names a manifest the archive does not hold.
func brokenLayoutTar(t *testing.T) []byte {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(imageOfLayer(t, tarOf(t, map[string][]byte{"a": []byte("a")}))); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if strings.HasPrefix(rel, "blobs/") && fi.Size() < 2048 {
			return nil // the manifest and config: left out
		}
		b, err := os.ReadFile(path)
		files[rel] = b
		return err
	})
	return tarOf(t, files)
}

// wantNoHostPath fails t when s names the test daemon's data directory or
// the temporary directory it is in.
func wantNoHostPath(t *testing.T, what, s string) {
	t.Helper()
	if strings.Contains(s, env.dataDir) || strings.Contains(s, filepath.Dir(env.dataDir)) {
		t.Errorf("%s names a host path: %s", what, s)
	}
}

// problemBody decodes a problem+json body.
func problemBody(t *testing.T, body string) client.Error {
	t.Helper()
	var p client.Error
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("not a problem document: %q", body)
	}
	return p
}

// TestHostileUploadNamesNoHostPath: bad template uploads (not a tar, a
// manifest naming files the archive lacks, an OCI layout missing its
// blobs, an unknown ?ref=) answered with the path the upload was spooled
// to ("import image \"/var/lib/forkbox/templates/.upload-NNN.tar\": ...")
// and an imported template's source was that path. Answers, their audit
// records and template views must name paths in the image only.
func TestHostileUploadNamesNoHostPath(t *testing.T) {
	need(t)
	good := craftedImage(t)
	for _, c := range []struct {
		name, query string
		body        []byte
		status      int
	}{
		{"garbage", "", []byte("not a tar"), 400},
		{"manifest naming missing files", "", tarOf(t, map[string][]byte{
			"manifest.json": []byte(`[{"Config":"c.json","RepoTags":["x:1"],"Layers":["l.tar"]}]`)}), 400},
		{"oci layout without blobs", "", brokenLayoutTar(t), 400},
		{"unknown ref", "?ref=nope:1", good, 400},
		{"shared is not a boolean", "?shared=yes", good, 400},
	} {
		status, ctype, body := rawRequest(t, "PUT", "/v1/templates/hostile-upload"+c.query, string(c.body), env.key, nil)
		if status != c.status || ctype != "application/problem+json" || problemBody(t, body).Detail == "" {
			t.Errorf("%s: %d %s %s, want %d with a detail", c.name, status, ctype, body, c.status)
		}
		wantNoHostPath(t, c.name+": the answer", body)
	}
	recs, err := env.c.Audit(ctxFor(t, time.Minute), client.AuditFilter{Kind: "template.import", Outcome: "error", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(recs)
	wantNoHostPath(t, "the audit records of failed imports", string(b))

	ctx := ctxFor(t, time.Minute)
	tpl, err := env.c.ImportTemplate(ctx, "hostile-upload-ok", "", bytes.NewReader(good), int64(len(good)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.c.DeleteTemplate(ctxFor(t, time.Minute), tpl.Name) })
	ts, _ := env.c.Templates(ctx)
	for _, tp := range ts {
		if tp.Name == tpl.Name && tp.Source != "upload" {
			t.Errorf("template source %q, want \"upload\"", tp.Source)
		}
	}
	_, _, body := rawRequest(t, "GET", "/v1/templates/"+tpl.Name, "", env.key, nil)
	wantNoHostPath(t, "the template view", body)
}

// TestHostileAgentSocketGone: when a sandbox's agent socket is gone (the
// daemon's file under the data directory; in the gVisor tier root in the
// sandbox can remove it), exec, files and envd answers named the socket's
// host path ("dial unix /var/lib/forkbox/sandboxes/ID/agent.sock: ...").
// They must say what failed without it, in the retryable class (the
// sandbox itself runs). The daemon keeps idle connections to an agent, so
// a streaming exec holds one while the socket goes, and calls made at once
// beside it have to dial.
func TestHostileAgentSocketGone(t *testing.T) {
	sb := e2bCreate(t)
	ctx := ctxFor(t, 2*time.Minute)
	req, _ := http.NewRequestWithContext(ctx, "POST", env.d.URL+"/v1/sessions/"+sb.SandboxID+"/exec",
		strings.NewReader(`{"cmd":"sleep 60"}`))
	req.Header.Set("Authorization", "Bearer "+env.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // (the command is killed when its caller goes)
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "event: start\n" {
		t.Fatalf("exec stream: %q %v", line, err)
	}
	if err := os.Remove(filepath.Join(env.dataDir, "sandboxes", sb.SandboxID, "agent.sock")); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		what   string
		status int
		body   string
	}
	answers := make(chan answer, 16)
	for i := 0; i < 4; i++ {
		go func() {
			status, _, body := rawRequest(t, "GET", "/v1/sessions/"+sb.SandboxID+"/fs/stat?path=/etc", "", env.key, nil)
			answers <- answer{"stat", status, body}
		}()
		go func() {
			status, body := envdCall(t, sb.SandboxID, sb.EnvdAccessToken, "GET", "/files?path=/etc/hostname", nil)
			answers <- answer{"envd read", status, body}
		}()
	}
	failed := map[string]bool{}
	for i := 0; i < 8; i++ {
		a := <-answers
		wantNoHostPath(t, a.what, a.body)
		t.Logf("%s: %d %.300s", a.what, a.status, a.body)
		switch {
		case a.status == 200:
			// An idle connection was still there.
		case a.what == "stat" && a.status == 503 && strings.Contains(problemBody(t, a.body).Detail, "agent"),
			a.what == "envd read" && a.status == http.StatusBadGateway:
			failed[a.what] = true
		default:
			t.Errorf("%s: %d %s, want 200, or 503 (stat) / 502 (envd) saying the agent cannot be reached", a.what, a.status, a.body)
		}
	}
	if !failed["stat"] || !failed["envd read"] {
		t.Errorf("no call had to dial the gone socket (failed: %v); the test proves nothing", failed)
	}
}

// ageTemplate makes imported template name what an import before
// storage.PrepareMountTargets left: its /etc/hosts a symlink into /proc,
// in the copy the storage driver starts sandboxes from (the btrfs
// template subvolume, made writable for the change, or the template's
// rootfs, which the overlay driver uses as its lower layer; on btrfs an
// import keeps no other copy).
func ageTemplate(t *testing.T, name string) {
	t.Helper()
	relink := func(root string) {
		p := filepath.Join(root, "etc", "hosts")
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/proc/self/environ", p); err != nil {
			t.Fatal(err)
		}
	}
	sub := filepath.Join(env.dataDir, "storage", "btrfs", "templates", name)
	if _, err := os.Stat(sub); err != nil {
		// Not the btrfs driver: overlay uses the template's rootfs.
		relink(filepath.Join(env.dataDir, "templates", name, "rootfs"))
		return
	}
	runHost(t, "btrfs", "property", "set", "-ts", sub, "ro", "false")
	relink(sub)
	runHost(t, "btrfs", "property", "set", "-ts", sub, "ro", "true")
}

// TestHostileTemplateMountTargets: an image whose /etc/hosts (or
// hostname, machine-id, resolv.conf, or /etc itself) is a symlink into
// /proc, a directory or a FIFO imported fine, and then every create was a
// bare 500 (the runtime refuses to mount the sandbox's own file there).
// The import must replace such entries, in both tiers a sandbox of it
// must start with its own files, and a template left so by an earlier
// import must be a 400 naming the template.
func TestHostileTemplateMountTargets(t *testing.T) {
	need(t)
	images := map[string][]byte{
		"hosts-proc": craftedImage(t, layerEntry{name: "etc/", typ: tar.TypeDir},
			layerEntry{name: "etc/hosts", typ: tar.TypeSymlink, link: "/proc/self/environ"},
			layerEntry{name: "etc/machine-id", typ: tar.TypeSymlink, link: "/proc/1/mounts"},
			layerEntry{name: "etc/resolv.conf", typ: tar.TypeSymlink, link: "../run/systemd/resolve/stub-resolv.conf"}),
		"etc-proc": craftedImage(t, layerEntry{name: "etc", typ: tar.TypeSymlink, link: "/proc/self"}),
		"hostname-dir": craftedImage(t, layerEntry{name: "etc/", typ: tar.TypeDir}, layerEntry{name: "etc/hostname/", typ: tar.TypeDir},
			layerEntry{name: "etc/hostname/x", typ: tar.TypeReg, body: []byte("x")}),
	}
	tiers := []string{"runc"}
	if _, err := exec.LookPath("runsc"); err == nil {
		tiers = append(tiers, "gvisor")
	} else if os.Getenv("CI") != "" {
		t.Fatal("runsc is not installed; CI must run the gVisor tier too")
	} else {
		t.Log("runsc is not installed: the gVisor tier is not tried")
	}
	ctx := ctxFor(t, 5*time.Minute)
	for kind, img := range images {
		tplName := "hostile-" + kind
		if _, err := env.c.ImportTemplate(ctx, tplName, "", bytes.NewReader(img), int64(len(img))); err != nil {
			t.Fatalf("%s: import: %v", kind, err)
		}
		t.Cleanup(func() { env.c.DeleteTemplate(ctxFor(t, time.Minute), tplName) })
		for _, tier := range tiers {
			s, _, err := env.c.CreateSession(ctx, client.CreateRequest{Template: tplName, Isolation: tier}, "")
			if err != nil {
				t.Errorf("%s in %s: create: %v", kind, tier, err)
				continue
			}
			out := sh(t, s.ID, "cat /etc/hosts /etc/hostname; stat -c %F /etc/machine-id /etc/resolv.conf")
			env.c.DeleteSession(ctx, s.ID)
			if !strings.Contains(out, "127.0.1.1\t"+s.ID+"\n") || !strings.Contains(out, "\n"+s.ID+"\n") ||
				strings.Count(out, "regular") != 2 {
				t.Errorf("%s in %s: the sandbox's own files are not in place: %q", kind, tier, out)
			}
		}
	}

	// A template an earlier import left with a symlink there.
	ageTemplate(t, "hostile-hosts-proc")
	for _, tier := range tiers {
		_, _, err := env.c.CreateSession(ctx, client.CreateRequest{Template: "hostile-hosts-proc", Isolation: tier}, "")
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Field != "template" ||
			!strings.Contains(ae.Detail, "hostile-hosts-proc") || !strings.Contains(ae.Detail, "/etc/hosts") {
			t.Errorf("an aged template in %s: %v, want a 400 naming the template and /etc/hosts", tier, err)
		}
		if err != nil {
			wantNoHostPath(t, "the refusal", err.Error())
		}
	}
}

// TestHostileProcFiles: the files API sized downloads by stat, so
// /proc/self/mountinfo (not seekable) was a 503, the retryable class, for
// a deterministic failure, and /proc/PID/environ (stat size 0) an empty
// 200; an agent's own failure was a 503 too. Such files must be read to
// EOF, and a file the agent cannot read must be a 502 agent-failed.
func TestHostileProcFiles(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	// (The agent reads files as root of the sandbox without CAP_SYS_PTRACE:
	// the environment of another user's process is not its to read.)
	pid, err := env.c.ExecBackground(ctxFor(t, time.Minute), s.ID, client.ExecRequest{
		Argv: []string{"sleep", "300"}, User: "root", Env: map[string]string{"HOSTILE_MARK": "proc-read-to-eof"}})
	if err != nil {
		t.Fatal(err)
	}
	defer env.c.Kill(ctxFor(t, time.Minute), s.ID, pid)
	environ := string(download(t, s.ID, "/proc/"+strconv.Itoa(pid)+"/environ", ""))
	if !strings.Contains(environ, "HOSTILE_MARK=proc-read-to-eof\x00") {
		t.Errorf("/proc/%d/environ: %q, want the command's environment", pid, environ)
	}
	if mi := string(download(t, s.ID, "/proc/self/mountinfo", "")); !strings.Contains(mi, " /etc/hosts ") {
		t.Errorf("/proc/self/mountinfo: %q, want the sandbox's mounts", mi)
	}
	if b := download(t, s.ID, "/proc/1/environ", "root"); len(b) == 0 {
		t.Error("/proc/1/environ: empty")
	}
	want := sh(t, s.ID, "cat /sys/devices/system/cpu/online")
	if got := string(download(t, s.ID, "/sys/devices/system/cpu/online", "")); got != want {
		t.Errorf("a sysfs file (stat size 4096): %q, want %q", got, want)
	}
	// Reading /proc/self/mem from offset 0 fails with EIO, every time.
	status, _, body := rawRequest(t, "GET", "/v1/sessions/"+s.ID+"/files/proc/self/mem", "", env.key, nil)
	if p := problemBody(t, body); status != http.StatusBadGateway || p.Type != "/problems/agent-failed" {
		t.Errorf("/proc/self/mem: %d %s, want 502 agent-failed", status, body)
	}
	if _, err := env.c.Download(ctxFor(t, time.Minute), s.ID, "/proc/self/mem", ""); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("the client classes agent-failed as %v, want internal", err)
	}
}

// TestHostileJSONConformance: the API read bodies of any Content-Type as
// JSON, matched field names in any case ({"CPU":2} made a session,
// although unknown fields are refused), made a session of a null body,
// refused "bearer KEY" (the scheme is case-insensitive: RFC 9110 §11.1),
// answered an oversized body 400 rather than 413, and ignored an unknown
// ?format on the audit log. None of these may create anything.
func TestHostileJSONConformance(t *testing.T) {
	need(t)
	before := sandboxArtifacts(t)
	for _, c := range []struct {
		name, body, ctype string
		status            int
		typ, field        string
	}{
		{"form-encoded (curl -d)", `{"cpu":0.5}`, "application/x-www-form-urlencoded", 415, "unsupported-media-type", "Content-Type"},
		{"text/plain", `{"cpu":0.5}`, "text/plain", 415, "unsupported-media-type", "Content-Type"},
		{"a non-UTF-8 charset", `{"cpu":0.5}`, "application/json; charset=latin1", 415, "unsupported-media-type", "Content-Type"},
		{"field in another case", `{"CPU":2}`, "application/json", 400, "invalid-argument", "CPU"},
		{"field in another case, +json", `{"Template":"base"}`, "application/merge-patch+json", 400, "invalid-argument", "Template"},
		{"nested field in another case", `{"network":{"Allow":["pypi.org:443"]}}`, "application/json; charset=utf-8", 400, "invalid-argument", "network.Allow"},
		{"duplicate field", `{"cpu":0.5,"cpu":64}`, "application/json", 400, "invalid-argument", "cpu"},
		{"null", `null`, "application/json", 400, "invalid-argument", "body"},
		{"null, no Content-Type", ` null `, "", 400, "invalid-argument", "body"},
		{"oversized", `{"metadata":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`, "application/json", 413, "content-too-large", "body"},
	} {
		h := map[string]string{}
		if c.ctype != "" {
			h["Content-Type"] = c.ctype
		}
		status, ctype, body := rawRequest(t, "POST", "/v1/sessions", c.body, env.key, h)
		p := problemBody(t, body)
		if status != c.status || ctype != "application/problem+json" || p.Type != "/problems/"+c.typ || p.Field != c.field {
			t.Errorf("%s: %d %s %.200s, want %d %s naming %q", c.name, status, ctype, body, c.status, c.typ, c.field)
		}
	}
	if after := sandboxArtifacts(t); after != before {
		t.Errorf("refused creates left sessions behind: %d before, %d after", before, after)
	}

	// The scheme of Authorization in any case; any run of spaces after it.
	for _, auth := range []string{"bearer " + env.key, "BEARER " + env.key, "Bearer   " + env.key} {
		status, _, body := rawRequest(t, "GET", "/v1/info", "", "", map[string]string{"Authorization": auth})
		if status != 200 {
			t.Errorf("Authorization %q: %d %s", strings.Replace(auth, env.key, "KEY", 1), status, body)
		}
	}
	// Query parameters that take one of a few values refuse the others.
	for _, q := range []struct{ method, path, field string }{
		{"GET", "/v1/audit?format=xml", "format"},
		{"GET", "/v1/audit?outcome=maybe", "outcome"},
		{"DELETE", "/v1/snapshots/nosuchsnapshot?force=perhaps", "force"},
		{"DELETE", "/v1/tenants/nosuchtenant?force=perhaps", "force"},
	} {
		status, _, body := rawRequest(t, q.method, q.path, "", env.key, nil)
		if p := problemBody(t, body); status != 400 || p.Field != q.field {
			t.Errorf("%s %s: %d %s, want 400 naming %s", q.method, q.path, status, body, q.field)
		}
	}
	// Accepted media types (the body itself is refused after the check).
	for _, ct := range []string{"application/json; charset=UTF-8", "application/vnd.forkbox+json", ""} {
		h := map[string]string{}
		if ct != "" {
			h["Content-Type"] = ct
		}
		status, _, body := rawRequest(t, "POST", "/v1/sessions", `{"bogus":1}`, env.key, h)
		if p := problemBody(t, body); status != 400 || p.Field != "bogus" {
			t.Errorf("Content-Type %q: %d %s, want the body read (400 naming bogus)", ct, status, body)
		}
	}
	// E2B's control plane keeps E2B's own decoding: any case, any type.
	status, _, body := rawRequest(t, "POST", "/v2/sandboxes", `{"TemplateID":"nosuchtemplate"}`, env.key,
		map[string]string{"Content-Type": "text/plain"})
	if status != http.StatusNotFound || !strings.Contains(body, "nosuchtemplate") {
		t.Errorf("E2B create with another case and type: %d %s, want E2B's own answer about the template", status, body)
	}
}

// TestHostileRoutingErrorsAreProblems: errors the router made before a
// handler ran were text/plain or text/html: ".../files" without a file was
// a 307 redirect, an empty id "the URL path is not clean". Every error the
// API controls must be problem+json, saying what is wrong.
func TestHostileRoutingErrorsAreProblems(t *testing.T) {
	need(t)
	for _, c := range []struct {
		method, path string
		status       int
		field, text  string
	}{
		{"GET", "/v1/sessions/abc/files", 400, "path", "is empty"},
		{"PUT", "/v1/sessions/abc/files", 400, "path", "is empty"},
		{"POST", "/v1/sessions//exec", 400, "id", "a session id is required"},
		{"DELETE", "/v1/snapshots//", 400, "id", "a snapshot id is required"},
		{"GET", "/v1/sessions/abc/processes//stream", 400, "id", "a process id is required"},
		{"GET", "/v1/sessions/abc/../def", 400, "path", "not clean"},
		{"PATCH", "/v1/sessions", 405, "", "PATCH"},
		{"GET", "/v1/nothing", 404, "", "no such endpoint"},
	} {
		// (Redirects are answers here, not followed.)
		req, err := http.NewRequestWithContext(ctxFor(t, time.Minute), c.method, env.d.URL+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+env.key)
		noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		status, ctype, body := resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
		var p client.Error
		_ = json.Unmarshal(b, &p)
		if status != c.status || ctype != "application/problem+json" || p.Field != c.field || !strings.Contains(p.Detail, c.text) {
			t.Errorf("%s %s: %d %s %s, want %d problem+json naming %q: ...%s...", c.method, c.path, status, ctype, body,
				c.status, c.field, c.text)
		}
	}
}

// TestHostileCLIEmptyID: `forkbox exec "" -- true` answered "the URL path
// is not clean". Every command that takes an id must say which id is
// required (exit 125, or 1 for the commands of several ids, which go on
// with the others) and send nothing.
func TestHostileCLIEmptyID(t *testing.T) {
	need(t)
	for _, c := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"exec", "", "--", "true"}, "a session id is required", 125},
		{[]string{"rm", ""}, "a session id is required", 125},
		{[]string{"snapshot", ""}, "a session id is required", 125},
		{[]string{"fork", ""}, "a session id is required", 125},
		{[]string{"pause", ""}, "a session id is required", 125},
		{[]string{"resume", ""}, "a session id is required", 125},
		{[]string{"egress", ""}, "a session id is required", 125},
		{[]string{"cp", ":/etc/hostname", "-"}, "a session id is required", 125},
		{[]string{"cp", "/etc/hostname", ":/tmp/x"}, "a session id is required", 125},
		{[]string{"fork", "--from-snapshot", ""}, "a snapshot id is required", 125},
		{[]string{"snapshot", "rm", ""}, "a snapshot id is required", 125},
		{[]string{"template", "rm", ""}, "a template name is required", 125},
		{[]string{"tenant", "show", ""}, "a tenant name is required", 125},
		{[]string{"tenant", "rm", ""}, "a tenant name is required", 125},
		{[]string{"key", "revoke", ""}, "a key id is required", 125},
	} {
		_, stderr, code := forkbox(t, "", c.args...)
		if code != c.code || stderr != "forkbox: "+c.want+"\n" {
			t.Errorf("forkbox %q: exit %d, %q; want %d and %q", c.args, code, stderr, c.code, c.want)
		}
	}
}
