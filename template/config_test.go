package template

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/image"
)

// TestApplyConfig proves an image's USER, ENTRYPOINT and CMD become the
// template's: a user the image's passwd has, a uid, root and user pass;
// a name it lacks, a uid past the sandbox's ids and a passwd that is a
// link are refused naming "user"; --start-cmd without a command is
// refused naming "start_cmd".
func TestApplyConfig(t *testing.T) {
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\napp:x:1500:1500::/home/app:/bin/sh\n"), 0o644)
	img := &image.Image{User: "app:app", Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"serve"}}
	var tpl storage.Template
	if err := applyConfig(&tpl, img, rootfs, ImportOptions{StartCmd: true}, 65536); err != nil {
		t.Fatal(err)
	}
	if tpl.User != "app" || strings.Join(tpl.Cmd, " ") != "/bin/sh -c serve" || strings.Join(tpl.StartCmd, " ") != "/bin/sh -c serve" {
		t.Fatalf("template %+v", tpl)
	}
	for _, u := range []string{"1500", "root", "user", ""} {
		tpl = storage.Template{}
		if err := applyConfig(&tpl, &image.Image{User: u}, rootfs, ImportOptions{}, 65536); err != nil || tpl.User != u || tpl.StartCmd != nil {
			t.Errorf("USER %q: %+v, %v", u, tpl, err)
		}
	}
	for _, u := range []string{"nobody", "70000", "Bad Name"} {
		err := applyConfig(&storage.Template{}, &image.Image{User: u}, rootfs, ImportOptions{}, 65536)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "user" {
			t.Errorf("USER %q: %v, want an invalid user", u, err)
		}
	}
	err := applyConfig(&storage.Template{}, &image.Image{}, rootfs, ImportOptions{StartCmd: true}, 65536)
	if errdefs.Field(err) != "start_cmd" {
		t.Errorf("start command of an image without one: %v", err)
	}
	// A passwd that is a link (here to a file that has the user) has no
	// entries: a link could lead out of the image.
	linked := t.TempDir()
	os.MkdirAll(filepath.Join(linked, "etc"), 0o755)
	os.Symlink(filepath.Join(rootfs, "etc", "passwd"), filepath.Join(linked, "etc", "passwd"))
	if err := applyConfig(&storage.Template{}, &image.Image{User: "app"}, linked, ImportOptions{}, 65536); errdefs.Field(err) != "user" {
		t.Errorf("USER app with a linked passwd: %v, want refused", err)
	}
}

func TestCheckSource(t *testing.T) {
	for _, ok := range []string{"", "img.tar", "python:3.12 (py.tar)", "docker.io/library/alpine:3.20"} {
		if err := CheckSource(ok); err != nil {
			t.Errorf("CheckSource(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"a\nb", strings.Repeat("x", 201), "\x7f"} {
		if err := CheckSource(bad); errdefs.Field(err) != "source" {
			t.Errorf("CheckSource(%q): %v, want refused", bad, err)
		}
	}
}
