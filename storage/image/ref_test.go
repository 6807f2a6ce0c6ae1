package image

import (
	"errors"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/forkbox/forkbox/errdefs"
)

// TestImportRefSelection selects each of two images by ref in every format
// and checks that "", unknown and malformed refs fail with
// ErrInvalidArgument.
func TestImportRefSelection(t *testing.T) {
	requireRoot(t)
	a := imageOf(t, v1.Config{Env: []string{"WHICH=A"}}, []entry{fileE("which", "A", 0o644)})
	b := imageOf(t, v1.Config{Env: []string{"WHICH=B"}}, []entry{fileE("which", "B", 0o644)})
	for format, src := range sources(t, named{"myimg:latest", a}, named{"python:3.12", b}) {
		t.Run(format, func(t *testing.T) {
			for ref, want := range map[string]string{
				"myimg:latest": "A", "myimg": "A", "docker.io/library/myimg:latest": "A", "python:3.12": "B",
			} {
				got, root, err := importTo(t, src, ref)
				if err != nil {
					t.Errorf("ref %q: %v", ref, err)
					continue
				}
				wantFile(t, filepath.Join(root, "which"), want, 0o644, 100000, 100000)
				if !slices.Equal(got.Env, []string{"WHICH=" + want}) {
					t.Errorf("ref %q: env %v", ref, got.Env)
				}
			}
			for _, ref := range []string{"", "python:3.11", "nope", "::bad::"} {
				_, root, err := importTo(t, src, ref)
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("ref %q: err %v, want invalid argument", ref, err)
				}
				wantGone(t, root)
			}
		})
	}
}

// TestImportBareTagAnnotation checks that an OCI ref.name annotation holding
// only a tag ("3.12") matches a ref with that tag.
func TestImportBareTagAnnotation(t *testing.T) {
	requireRoot(t)
	a := imageOf(t, v1.Config{}, []entry{fileE("which", "A", 0o644)})
	b := imageOf(t, v1.Config{}, []entry{fileE("which", "B", 0o644)})
	src := writeLayout(t, named{"3.11", a}, named{"3.12", b})
	_, root, err := importTo(t, src, "python:3.12")
	if err != nil {
		t.Fatal(err)
	}
	wantFile(t, filepath.Join(root, "which"), "B", 0o644, 100000, 100000)
}

// TestImportMultiPlatformIndex checks that a multi-platform index resolves to
// the linux/GOARCH image and that its manifest digest is returned.
func TestImportMultiPlatformIndex(t *testing.T) {
	requireRoot(t)
	native := imageOf(t, v1.Config{}, []entry{fileE("arch", "native", 0o644)})
	other := imageOf(t, v1.Config{}, []entry{fileE("arch", "other", 0o644)})
	otherArch := "s390x"
	if runtime.GOARCH == otherArch {
		otherArch = "amd64"
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch}}},
		mutate.IndexAddendum{Add: native, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationRefName: "multi:1"})); err != nil {
		t.Fatal(err)
	}
	got, root, err := importTo(t, dir, "multi:1")
	if err != nil {
		t.Fatal(err)
	}
	wantFile(t, filepath.Join(root, "arch"), "native", 0o644, 100000, 100000)
	if d, _ := native.Digest(); got.Digest != d.String() {
		t.Errorf("digest %s, want the native manifest's %s", got.Digest, d)
	}
}
