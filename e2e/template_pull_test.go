package e2e

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// tplName is a template name no other test uses.
func tplName(prefix string) string {
	return prefix + "-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
}

// layerCached reports whether the daemon's layer cache holds blob d.
func layerCached(d v1.Hash) bool {
	_, err := os.Stat(filepath.Join(env.dataDir, "layers", d.Algorithm, d.Hex))
	return err == nil
}

// wantNoPartials fails the test if the layer cache has a download left
// in its tmp/ or the templates directory a half-made template.
func wantNoPartials(t *testing.T) {
	t.Helper()
	if ents, _ := os.ReadDir(filepath.Join(env.dataDir, "layers", "tmp")); len(ents) > 0 {
		t.Errorf("the layer cache's tmp/ holds %d entries", len(ents))
	}
	ents, _ := os.ReadDir(filepath.Join(env.dataDir, "templates"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("templates/ holds %s", e.Name())
		}
	}
}

// deleteTemplateAtEnd deletes template name when the test ends.
func deleteTemplateAtEnd(t *testing.T, c *client.Client, name string) {
	t.Cleanup(func() { _ = c.DeleteTemplate(ctxFor(t, time.Minute), name) })
}

// TestTemplatePull proves an image pushed to a real registry becomes a
// template through the daemon's pull (progress streamed, the image's
// ENV and WORKDIR kept) whose session runs the image's busybox; that a
// second image sharing its layers downloads only its new layer (the
// registry's blob GETs counted); and that the layers stay held while
// templates use them.
func TestTemplatePull(t *testing.T) {
	need(t)
	reg := newTestRegistry(t)
	base := busyboxV1(t)
	mark := uniq(t)
	own := fileLayer(t, "etc/pulled", mark+"\n")
	img1 := withLayers(t, base, own)
	ref1, dig1 := reg.push(t, "test/bb:1", img1)
	ctx := ctxFor(t, 2*time.Minute)

	name1 := tplName("pull")
	var events []client.PullEvent
	tpl, err := env.c.PullTemplate(ctx, name1, ref1, client.PullOptions{Progress: func(e client.PullEvent) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, env.c, name1)
	if tpl.Digest != dig1.String() || tpl.Source != ref1 || tpl.Layers != 2 || tpl.Workdir != "/srv/app" {
		t.Fatalf("pulled template %+v, want digest %s, source %s, 2 layers, workdir /srv/app", tpl, dig1, ref1)
	}
	if len(events) < 3 || events[0].Kind != "resolved" || events[0].Digest != dig1.String() || len(events[0].Layers) != 2 ||
		events[len(events)-1].Kind != "unpacking" {
		t.Fatalf("events %+v, want resolved (2 layers), layer progress, unpacking", events)
	}
	ownD := digestOf(t, own)
	if !completeLayer(events, ownD.String(), false) {
		t.Errorf("no complete, downloaded layer event for %s in %+v", ownD, events)
	}
	s := newSession(t, client.CreateRequest{Template: name1})
	out := sh(t, s.ID, "echo $IMAGE_VAR; pwd; cat /etc/motd /etc/pulled")
	if want := "baked\n/srv/app\nfrom the image\n" + mark + "\n"; out != want {
		t.Fatalf("in a session of the pulled template: %q, want prefix %q", out, want)
	}

	// A second image with the same layers and one more: only the new one
	// is downloaded.
	extra := fileLayer(t, "etc/second", "second image\n")
	img2 := withLayers(t, img1, extra)
	ref2, dig2 := reg.push(t, "test/bb2:1", img2)
	baseD := digestOf(t, mustLayers(t, base)[0])
	extraD := digestOf(t, extra)
	before := map[v1.Hash]int{baseD: reg.blobGets(baseD), ownD: reg.blobGets(ownD), extraD: reg.blobGets(extraD)}
	events = nil
	name2 := tplName("pull2")
	tpl2, err := env.c.PullTemplate(ctx, name2, ref2, client.PullOptions{Progress: func(e client.PullEvent) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, env.c, name2)
	if tpl2.Digest != dig2.String() || tpl2.Layers != 3 {
		t.Fatalf("second template %+v", tpl2)
	}
	if n := reg.blobGets(baseD) - before[baseD]; n != 0 {
		t.Errorf("the shared base layer was downloaded %d more times", n)
	}
	if n := reg.blobGets(ownD) - before[ownD]; n != 0 {
		t.Errorf("the shared second layer was downloaded %d more times", n)
	}
	if n := reg.blobGets(extraD) - before[extraD]; n != 1 {
		t.Errorf("the new layer was downloaded %d times, want 1", n)
	}
	if !completeLayer(events, ownD.String(), true) || !completeLayer(events, extraD.String(), false) {
		t.Errorf("events %+v: want the shared layer cached and the new one downloaded", events)
	}
	got, err := storage.LoadTemplate(filepath.Join(env.dataDir, "templates", name2))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.LayerDigests) != 3 || got.LayerDigests[2] != extraD.String() {
		t.Fatalf("template.json layer digests %v", got.LayerDigests)
	}
	for _, d := range []v1.Hash{baseD, ownD, extraD} {
		if !layerCached(d) {
			t.Errorf("layer %s is not in the layer cache", d)
		}
	}
	s2 := newSession(t, client.CreateRequest{Template: name2})
	if out := sh(t, s2.ID, "cat /etc/second"); out != "second image\n" {
		t.Fatalf("second template: %q", out)
	}
	// The name is taken now.
	if _, err := env.c.PullTemplate(ctx, name2, ref2, client.PullOptions{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a pull over an existing template: %v, want conflict", err)
	}
	wantNoPartials(t)
}

// completeLayer reports whether events hold a complete layer event for
// digest d, cached as said.
func completeLayer(events []client.PullEvent, d string, cached bool) bool {
	for _, e := range events {
		if e.Kind == "layer" && e.Layer != nil && e.Layer.Digest == d && e.Layer.Complete && e.Layer.Cached == cached {
			return true
		}
	}
	return false
}

func mustLayers(t *testing.T, img v1.Image) []v1.Layer {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// errProblem is the problem type slug of an API error.
func errProblem(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return strings.TrimPrefix(ce.Type, "/problems/")
	}
	return ""
}

// problemStatus is the HTTP status of an API error.
func problemStatus(err error) int {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Status
	}
	return 0
}

// TestTemplatePullFailures proves a pull that cannot succeed leaves
// nothing: a registry serving a blob that does not match its digest (502,
// no blob in the cache, no template), one that does not answer (504), an
// image it does not have (404), and a registry that requires credentials
// (403 without or with wrong ones; with the right ones the pull works,
// and the password is in no answer, audit record or database file).
func TestTemplatePullFailures(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 2*time.Minute)
	reg := newTestRegistry(t)
	bad := fileLayer(t, "etc/bad", uniq(t))
	ref, _ := reg.push(t, "test/corrupt:1", withLayers(t, empty.Image, bad))
	badD := digestOf(t, bad)
	reg.corruptBlob(badD)
	name := tplName("corrupt")
	for _, stream := range []bool{false, true} {
		o := client.PullOptions{}
		if stream {
			o.Progress = func(client.PullEvent) {}
		}
		_, err := env.c.PullTemplate(ctx, name, ref, o)
		if problemStatus(err) != http.StatusBadGateway || errProblem(err) != "registry-error" || !strings.Contains(err.Error(), ref) ||
			!strings.Contains(err.Error(), "does not match") {
			t.Fatalf("pull of a corrupted blob (stream %v): %v, want 502 registry-error naming %s", stream, err, ref)
		}
	}
	if layerCached(badD) {
		t.Error("the corrupted blob is in the layer cache")
	}
	if ts, err := env.c.Templates(ctx); err != nil || hasTemplate(ts, name) {
		t.Errorf("templates after a failed pull: %v, %v: want none named %s", ts, err, name)
	}
	wantNoPartials(t)

	// A registry that does not answer.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	_, err = env.c.PullTemplate(ctx, tplName("gone"), gone+"/test/x:1", client.PullOptions{})
	if problemStatus(err) != http.StatusGatewayTimeout || errProblem(err) != "registry-unreachable" || !strings.Contains(err.Error(), gone) {
		t.Fatalf("pull from a registry that does not answer: %v, want 504 registry-unreachable", err)
	}
	// An image the registry does not have; a bad reference; a platform no
	// linux has.
	if _, err := env.c.PullTemplate(ctx, tplName("none"), reg.host+"/test/none:1", client.PullOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("pull of a missing image: %v, want not found", err)
	}
	if _, err := env.c.PullTemplate(ctx, tplName("badref"), "UPPER/Case::x", client.PullOptions{}); errdefs.Field(unwrapField(err)) != "ref" {
		t.Fatalf("pull of a bad reference: %v, want a ref field error", err)
	}
	if _, err := env.c.PullTemplate(ctx, tplName("win"), ref, client.PullOptions{Platform: "windows/amd64"}); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "platform") {
		t.Fatalf("pull for windows: %v, want a platform field error", err)
	}

	// Basic auth in front of the registry.
	const user, pass = "puller", "s3cret-pull-password-7731"
	ok := fileLayer(t, "etc/private", uniq(t))
	reg.requireAuth(user, pass)
	privRef, privD := reg.push(t, "test/private:1", withLayers(t, empty.Image, ok))
	_, err = env.c.PullTemplate(ctx, tplName("noauth"), privRef, client.PullOptions{})
	if problemStatus(err) != http.StatusForbidden || errProblem(err) != "registry-denied" {
		t.Fatalf("pull without credentials: %v, want 403 registry-denied", err)
	}
	_, err = env.c.PullTemplate(ctx, tplName("badauth"), privRef, client.PullOptions{Auth: &client.RegistryAuth{Username: user, Password: pass + "x"}})
	if errProblem(err) != "registry-denied" || strings.Contains(err.Error(), pass) {
		t.Fatalf("pull with a wrong password: %v, want 403 registry-denied", err)
	}
	privName := tplName("auth")
	tpl, err := env.c.PullTemplate(ctx, privName, privRef, client.PullOptions{Auth: &client.RegistryAuth{Username: user, Password: pass}})
	if err != nil {
		t.Fatalf("pull with credentials: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, privName)
	if tpl.Digest != privD.String() {
		t.Fatalf("pulled %s, want %s", tpl.Digest, privD)
	}
	// The password is nowhere the daemon keeps things.
	// (Audit records are written after the answer, in batches: wait for
	// the pull's.)
	var status int
	var body []byte
	for i := 0; i < 50; i++ {
		status, _, body = rawCall(t, env.key, http.MethodGet, "/v1/audit?kind=template.import&format=jsonl", nil)
		if bytes.Contains(body, []byte(privName)) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status != http.StatusOK || bytes.Contains(body, []byte(pass)) || !bytes.Contains(body, []byte(privRef)) {
		t.Fatalf("audit: %d, holds the password: %v, names the ref: %v", status, bytes.Contains(body, []byte(pass)), bytes.Contains(body, []byte(privRef)))
	}
	for _, f := range []string{"forkbox.db", "forkbox.db-wal"} {
		b, _ := os.ReadFile(filepath.Join(env.dataDir, f))
		if bytes.Contains(b, []byte(pass)) {
			t.Errorf("%s holds the registry password", f)
		}
	}
	filepath.WalkDir(filepath.Join(env.dataDir, "templates", privName), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".json") {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(pass)) {
				t.Errorf("%s holds the registry password", p)
			}
		}
		return nil
	})
	wantNoPartials(t)
}

// unwrapField returns err (errdefs.Field reads a client error's field
// through this).
func unwrapField(err error) error {
	var ce *client.Error
	if errors.As(err, &ce) && ce.Field != "" {
		return errdefs.InvalidField(ce.Field, "%s", ce.Detail)
	}
	return err
}

// TestTemplatePullPlatform proves a multi-platform index is pulled for
// the platform asked (the host's by default), and a platform the index
// lacks is a 400 naming the ones it has.
func TestTemplatePullPlatform(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 2*time.Minute)
	reg := newTestRegistry(t)
	amd := withLayers(t, busyboxV1(t), fileLayer(t, "etc/arch", "amd64\n"))
	arm := withLayers(t, empty.Image, fileLayer(t, "etc/arch", "arm64\n"))
	arm, err := mutate.ConfigFile(arm, &v1.ConfigFile{OS: "linux", Architecture: "arm64", RootFS: mustConfig(t, arm).RootFS})
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	ref := reg.pushIndex(t, "test/multi:1", idx)
	amdD, _ := amd.Digest()
	armD, _ := arm.Digest()

	hostName := tplName("plat")
	tpl, err := env.c.PullTemplate(ctx, hostName, ref, client.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, env.c, hostName)
	want := amdD
	if runtime.GOARCH == "arm64" {
		want = armD
	}
	if tpl.Digest != want.String() {
		t.Fatalf("default platform pulled %s, want the host's image %s", tpl.Digest, want)
	}
	armName := tplName("plat-arm")
	tpl, err = env.c.PullTemplate(ctx, armName, ref, client.PullOptions{Platform: "linux/arm64"})
	if err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, env.c, armName)
	if tpl.Digest != armD.String() {
		t.Fatalf("linux/arm64 pulled %s, want %s", tpl.Digest, armD)
	}
	_, err = env.c.PullTemplate(ctx, tplName("plat-s390x"), ref, client.PullOptions{Platform: "linux/s390x"})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "linux/amd64") || !strings.Contains(err.Error(), "linux/arm64/v8") {
		t.Fatalf("pull for a platform the index lacks: %v, want 400 naming linux/amd64 and linux/arm64/v8", err)
	}
}

func mustConfig(t *testing.T, img v1.Image) *v1.ConfigFile {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return cf
}

// TestTemplatePullTenant proves a tenant's pulls keep within its policy:
// a registry at a loopback address is refused (403: a tenant may not make
// the daemon reach its own network) unless the daemon names it private
// (the test daemon names localhost); an image past max_template_mb is a
// 413 naming the limit; past max_templates a 429.
func TestTemplatePullTenant(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 2*time.Minute)
	reg := newTestRegistry(t)
	small := withLayers(t, empty.Image, fileLayer(t, "etc/small", uniq(t)))
	ref, _ := reg.push(t, "test/small:1", small)
	big := withLayers(t, empty.Image, fileLayer(t, "etc/big", randomText(2<<20)))
	bigRef, _ := reg.push(t, "test/big:1", big)
	_, _, tc := newTenant(t, env.c, "pull", client.TenantPolicy{MaxTemplates: 1, MaxTemplateMB: 1})

	_, err := tc.PullTemplate(ctx, tplName("t-loop"), ref, client.PullOptions{})
	if problemStatus(err) != http.StatusForbidden || errProblem(err) != "registry-address-not-allowed" {
		t.Fatalf("a tenant's pull from 127.0.0.1: %v, want 403 registry-address-not-allowed", err)
	}
	local := "localhost" + strings.TrimPrefix(reg.host, "127.0.0.1")
	_, err = tc.PullTemplate(ctx, tplName("t-big"), strings.Replace(bigRef, reg.host, local, 1), client.PullOptions{})
	if problemStatus(err) != http.StatusRequestEntityTooLarge || errProblem(err) != "template-too-large" || !strings.Contains(err.Error(), "max_template_mb") {
		t.Fatalf("a tenant's pull past max_template_mb: %v, want 413 template-too-large naming the limit", err)
	}
	name := tplName("t-small")
	if _, err := tc.PullTemplate(ctx, name, strings.Replace(ref, reg.host, local, 1), client.PullOptions{}); err != nil {
		t.Fatalf("a tenant's pull from the daemon's private registry: %v", err)
	}
	_, err = tc.PullTemplate(ctx, tplName("t-two"), strings.Replace(ref, reg.host, local, 1), client.PullOptions{})
	if problemStatus(err) != http.StatusTooManyRequests {
		t.Fatalf("a tenant's pull past max_templates: %v, want 429", err)
	}
	wantNoPartials(t)
}

// randomText is n bytes that do not compress.
func randomText(n int) string {
	b := make([]byte, n)
	var x uint64 = 0x9e3779b97f4a7c15
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return string(b)
}

// TestCLITemplatePull proves `forkbox template import NAME --ref REF`
// pulls through the daemon with the credentials of --username and
// --password-stdin, or of a docker config (--registry-config), printing a
// line per layer when standard error is no terminal; without credentials
// it fails saying the registry refused.
func TestCLITemplatePull(t *testing.T) {
	need(t)
	reg := newTestRegistry(t)
	const user, pass = "cli-user", "cli-pass-4410"
	reg.requireAuth(user, pass)
	img := withLayers(t, busyboxV1(t), fileLayer(t, "etc/cli", uniq(t)))
	ref, dig := reg.push(t, "test/cli:1", img)

	name1 := tplName("cli-pull")
	out, errOut, code := forkbox(t, pass+"\n", "template", "import", name1, "--ref", ref, "--username", user, "--password-stdin")
	if code != 0 || !strings.Contains(out, "imported "+name1+" ("+dig.String()+", 2 layers") {
		t.Fatalf("template import --ref: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	deleteTemplateAtEnd(t, env.c, name1)
	if !strings.Contains(errOut, ref+": "+dig.String()) || strings.Count(errOut, " downloaded\n") != 2 ||
		!strings.Contains(errOut, "layer 2/2 sha256:") || strings.Contains(errOut, pass) {
		t.Fatalf("progress lines %q: want the image, two downloaded layers and no password", errOut)
	}

	// The same layers through a docker config: both cached now.
	cfgDir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(`{"auths":{"`+reg.host+`":{"auth":"`+auth+`"}}}`), 0o600)
	name2 := tplName("cli-cfg")
	out, errOut, code = forkbox(t, "", "template", "import", name2, "--ref", ref, "--registry-config", cfgDir, "--quiet")
	if code != 0 || out != name2+"\n" || errOut != "" {
		t.Fatalf("template import --registry-config --quiet: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	deleteTemplateAtEnd(t, env.c, name2)
	name3 := tplName("cli-env")
	cmd := exec.Command(env.cli, "template", "import", name3, "--ref", ref)
	cmd.Env = append(os.Environ(), "FORKBOX_URL="+env.d.URL, "FORKBOX_API_KEY="+env.key, "DOCKER_CONFIG="+cfgDir, "HOME="+t.TempDir())
	b, err := cmd.CombinedOutput()
	if err != nil || strings.Count(string(b), " cached\n") != 2 {
		t.Fatalf("template import with DOCKER_CONFIG: %v: %s (want both layers cached)", err, b)
	}
	deleteTemplateAtEnd(t, env.c, name3)

	// On a terminal: one line redrawn in place.
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	name4 := tplName("cli-tty")
	cmd = exec.Command(env.cli, "template", "import", name4, "--ref", ref, "--registry-config", cfgDir)
	cmd.Env = append(os.Environ(), "FORKBOX_URL="+env.d.URL, "FORKBOX_API_KEY="+env.key)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	var screen bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&screen, ptmx); close(done) }()
	err = cmd.Wait()
	<-done
	deleteTemplateAtEnd(t, env.c, name4)
	if err != nil || !strings.Contains(screen.String(), "\r"+ref+": ") || !strings.Contains(screen.String(), "unpacking 2 layers") ||
		strings.Contains(screen.String(), " downloaded\n") {
		t.Fatalf("template import --ref on a terminal: %v; terminal got %q, stdout %q", err, screen.String(), stdout.String())
	}

	_, errOut, code = forkbox(t, "", "template", "import", tplName("cli-noauth"), "--ref", ref, "--registry-config", t.TempDir())
	if code != 125 || !strings.Contains(errOut, "refused access") || !strings.Contains(errOut, "403") {
		t.Fatalf("template import without credentials: exit %d, stderr %q", code, errOut)
	}
	for _, args := range [][]string{
		{"template", "import", "x"},
		{"template", "import", "x", "some.tar", "--platform", "linux/amd64"},
		{"template", "import", "x", "--ref", ref, "--username", user},
	} {
		if _, errOut, code := forkbox(t, "", args...); code != 125 || errOut == "" {
			t.Errorf("forkbox %v: exit %d, stderr %q; want a usage error", args, code, errOut)
		}
	}
}
