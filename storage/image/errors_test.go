package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
)

// TestImportErrors checks the error classes for a missing source, an existing
// rootfs, a zero id shift, a non-image file and a cancelled context, and that
// no rootfs is left behind.
func TestImportErrors(t *testing.T) {
	requireRoot(t)
	ok := imageOf(t, v1.Config{}, []entry{fileE("a", "a", 0o644)})
	src := writeLayout(t, named{"ok:1", ok})
	ctx := context.Background()

	if _, err := Import(ctx, filepath.Join(t.TempDir(), "missing"), "", filepath.Join(t.TempDir(), "r"), testShift); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing src: %v, want not found", err)
	}
	existing := t.TempDir()
	if _, err := Import(ctx, src, "", existing, testShift); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("existing rootfs: %v, want conflict", err)
	}
	if _, err := Import(ctx, src, "", filepath.Join(t.TempDir(), "r"), IDShift{UIDBase: 100000, GIDBase: 100000}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("zero shift size: %v, want invalid argument", err)
	}
	notImage := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(notImage, []byte("not a tar at all, definitely not"), 0o644)
	if _, root, err := importTo(t, notImage, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("garbage src: %v, want invalid argument", err)
	} else {
		wantGone(t, root)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	root := filepath.Join(t.TempDir(), "r")
	if _, err := Import(cctx, src, "", root, testShift); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	wantGone(t, root)
}

// TestImportIDRange checks that uids/gids >= shift.Size in layer 2 fail with
// ErrInvalidArgument and that the partial rootfs (layer 1 was applied) and
// any temporary files are removed.
func TestImportIDRange(t *testing.T) {
	requireRoot(t)
	for _, e := range []entry{
		fileE("big-uid", "x", 0o644).owned(65536, 0),
		fileE("big-gid", "x", 0o644).owned(0, 70000),
		dirE("dir-uid", 0o755).owned(1<<20, 0),
		symE("sym-uid", "x").owned(65536, 0),
	} {
		img := imageOf(t, v1.Config{}, []entry{fileE("lower/a", "a", 0o644)}, []entry{fileE("ok", "", 0o644), e})
		for format, src := range sources(t, named{"ids:1", img}) {
			_, root, err := importTo(t, src, "")
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "layer 2 entry") {
				t.Errorf("%s %s: err %v, want invalid argument naming layer 2", format, e.name, err)
			}
			wantGone(t, root) // cleaned up after the failure
			if ents, _ := os.ReadDir(filepath.Dir(root)); len(ents) != 0 {
				t.Errorf("%s %s: leftovers beside rootfs: %v", format, e.name, ents)
			}
		}
	}
}

// TestImportLimits lowers the byte and entry limits and checks that exceeding
// them fails with ErrResourceExhausted and removes the rootfs.
func TestImportLimits(t *testing.T) {
	requireRoot(t)
	img := imageOf(t, v1.Config{}, []entry{
		fileE("a", strings.Repeat("x", 4000), 0o644), fileE("b", "b", 0o644), fileE("c", "c", 0o644),
	})
	src := writeLayout(t, named{"big:1", img})
	oldBytes, oldEntries := maxImageBytes, maxEntries
	defer func() { maxImageBytes, maxEntries = oldBytes, oldEntries }()
	for _, lim := range []struct {
		bytes   int64
		entries int
	}{{3000, oldEntries}, {oldBytes, 2}} {
		maxImageBytes, maxEntries = lim.bytes, lim.entries
		_, root, err := importTo(t, src, "")
		if !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("limits %+v: err %v, want resource exhausted", lim, err)
		}
		wantGone(t, root)
	}
}

// TestImportTamperedLayer replaces a layer blob of an OCI layout and checks
// that the diff id verification rejects it.
func TestImportTamperedLayer(t *testing.T) {
	requireRoot(t)
	img := imageOf(t, v1.Config{}, []entry{fileE("a", "original", 0o644)})
	src := writeLayout(t, named{"t:1", img})
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	// Same compressed digest path, different content: the diff id check must catch it.
	evil := layerOf(t, []entry{fileE("a", "tampered", 0o644)})
	rc, err := evil.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	blob := filepath.Join(src, "blobs", d.Algorithm, d.Hex)
	f, err := os.Create(blob)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(rc); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, root, err := importTo(t, src, "")
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "diff id") {
		t.Errorf("tampered layer: %v, want invalid argument about the diff id", err)
	}
	wantGone(t, root)
}

// TestImportDepthLimit checks that directory nesting is limited on the real
// tree, also when a symlink shortens the names.
func TestImportDepthLimit(t *testing.T) {
	requireRoot(t)
	deep := strings.Repeat("d/", 600)
	ok := imageOf(t, v1.Config{}, []entry{fileE(deep+"f", "f", 0o644)})
	if _, _, err := importTo(t, writeLayout(t, named{"ok:1", ok}), ""); err != nil {
		t.Fatalf("600 levels: %v", err)
	}
	// A symlink to a deep directory lets a short name reach deeper; the
	// depth is counted on the real tree.
	evil := imageOf(t, v1.Config{}, []entry{fileE(deep+"f", "f", 0o644), symE("s", "/"+deep)},
		[]entry{fileE("s/"+strings.Repeat("d/", 500)+"f", "f", 0o644)})
	_, root, err := importTo(t, writeLayout(t, named{"evil:1", evil}), "")
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "deeper") {
		t.Errorf("1100 levels: %v, want invalid argument about the depth", err)
	}
	wantGone(t, root)
}

// TestImportErrorsNameNoHostPaths proves import errors name paths as the
// image has them, never where the archive, its unpacked OCI layout or the
// rootfs are on the host (they reach API clients), and keep their class.
func TestImportErrorsNameNoHostPaths(t *testing.T) {
	requireRoot(t)
	host := filepath.Dir(t.TempDir()) // every temporary directory of this test is below
	ok := imageOf(t, v1.Config{}, []entry{fileE("a", "a", 0o644)})

	garbage := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(garbage, []byte("not a tar at all, definitely not"), 0o644)

	broken := writeLayout(t, named{"ok:1", ok})
	blobs, _ := filepath.Glob(filepath.Join(broken, "blobs", "sha256", "*"))
	for _, b := range blobs {
		if fi, err := os.Stat(b); err == nil && fi.Size() < 2048 {
			os.Remove(b) // the manifest and config: the layout now names blobs it lacks
		}
	}
	for _, c := range []struct {
		name, src, ref string
		class          error
	}{
		{"garbage tar", garbage, "", errdefs.ErrInvalidArgument},
		{"unknown ref", writeDockerTar(t, named{"ok:1", ok}), "other:2", errdefs.ErrInvalidArgument},
		{"layout tar missing blobs", tarDir(t, broken), "", errdefs.ErrInvalidArgument},
		{"layout dir missing blobs", broken, "", errdefs.ErrInvalidArgument},
		{"missing source", filepath.Join(t.TempDir(), "missing.tar"), "", errdefs.ErrNotFound},
	} {
		_, _, err := importTo(t, c.src, c.ref)
		if err == nil || !errors.Is(err, c.class) {
			t.Errorf("%s: %v, want %v", c.name, err, c.class)
			continue
		}
		if strings.Contains(err.Error(), host) {
			t.Errorf("%s: the error names a host path: %v", c.name, err)
		}
	}
}
