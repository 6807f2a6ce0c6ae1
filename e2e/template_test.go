package e2e

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// busyboxImage builds a one-layer image holding a static busybox with a few
// applet links, PATH=/bin and working directory /srv/app, and returns it as
// a `docker save` tarball.
func busyboxImage(t *testing.T) []byte {
	t.Helper()
	img := busyboxV1(t)
	tag, _ := name.NewTag("forkbox.test/busybox:1")
	var out bytes.Buffer
	if err := tarball.Write(tag, img, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// busyboxV1 is busyboxImage's image.
func busyboxV1(t *testing.T) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs a static /bin/busybox (Debian busybox-static; make deps installs it)")
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := []string{"bin/", "srv/", "srv/app/", "etc/"}
	for _, d := range dirs {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, applet := range []string{"sh", "echo", "id", "cat", "pwd", "ls", "true"} {
		tw.WriteHeader(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	msg := []byte("from the image\n")
	tw.WriteHeader(&tar.Header{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(msg))})
	tw.Write(msg)
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "IMAGE_VAR=baked"}, WorkingDir: "/srv/app"})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestTemplateImport proves an OCI image imported from a `docker save`
// tarball becomes a template whose sandboxes run its binaries with its
// environment and working directory, and that templates in use cannot be
// deleted.
func TestTemplateImport(t *testing.T) {
	need(t)
	img := busyboxImage(t)
	ctx := ctxFor(t, 2*time.Minute)
	tplName := "bb-" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	tpl, err := env.c.ImportTemplate(ctx, tplName, "", bytes.NewReader(img), int64(len(img)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tpl.Digest, "sha256:") || tpl.SizeBytes < 500_000 {
		t.Fatalf("imported template %+v", tpl)
	}
	if _, err := env.c.ImportTemplate(ctx, tplName, "", bytes.NewReader(img), int64(len(img))); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second import under the same name: %v, want conflict", err)
	}
	ts, _ := env.c.Templates(ctx)
	if !hasTemplate(ts, tplName) || !hasTemplate(ts, "base") {
		t.Fatalf("templates %+v", ts)
	}
	s := newSession(t, client.CreateRequest{Template: tplName})
	out := sh(t, s.ID, "echo $IMAGE_VAR; id -u; pwd; cat /etc/motd; ls /usr 2>&1 || true")
	want := "baked\n1000\n/srv/app\nfrom the image\n"
	if !strings.HasPrefix(out, want) {
		t.Fatalf("inside the imported template: %q, want prefix %q", out, want)
	}
	if !strings.Contains(out, "No such file") && !strings.Contains(out, "can't") {
		t.Errorf("the host's /usr is mounted into an imported template: %q", out)
	}
	if err := env.c.DeleteTemplate(ctx, tplName); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete of a template in use: %v, want conflict", err)
	}
	if err := env.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := env.c.DeleteTemplate(ctx, tplName); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(env.dataDir, "templates", tplName)); err == nil {
		t.Fatal("deleted template's files are left")
	}
	// A malformed upload is a 400 and leaves nothing behind.
	if _, err := env.c.ImportTemplate(ctx, "broken", "", strings.NewReader("not a tar"), 9); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("garbage upload: %v, want invalid argument", err)
	}
	entries, _ := os.ReadDir(filepath.Join(env.dataDir, "templates"))
	for _, e := range entries {
		if e.Name() != "base" && !strings.HasPrefix(e.Name(), "bb-") {
			t.Errorf("left in templates/: %s", e.Name())
		}
	}
}

func hasTemplate(ts []client.Template, name string) bool {
	for _, t := range ts {
		if t.Name == name {
			return true
		}
	}
	return false
}
