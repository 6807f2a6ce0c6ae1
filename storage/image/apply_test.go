package image

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
)

// TestApply unpacks an image given as a v1.Image (as a registry pull
// does), checks the manifest digest it is asked for, and keeps within
// Limits.MaxBytes.
func TestApply(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	img := imageOf(t, v1.Config{Env: []string{"A=1"}, WorkingDir: "/w", User: "1000"},
		[]entry{dirE("etc/", 0o755), fileE("etc/motd", "hello", 0o644)},
		[]entry{fileE("etc/motd", "second layer", 0o600), fileE("big", string(make([]byte, 4096)), 0o644)})
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	got, err := Apply(ctx, img, d, root, testShift, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != d.String() || got.Layers != 2 || got.WorkingDir != "/w" || got.User != "1000" || got.SizeBytes != 5+12+4096 {
		t.Fatalf("Apply: %+v", got)
	}
	wantFile(t, filepath.Join(root, "etc/motd"), "second layer", 0o600, testShift.UIDBase, testShift.GIDBase)

	// Another manifest digest than the one asked for: refused, nothing left.
	other := filepath.Join(t.TempDir(), "rootfs")
	wrong := v1.Hash{Algorithm: "sha256", Hex: "0000000000000000000000000000000000000000000000000000000000000000"}
	if _, err := Apply(ctx, img, wrong, other, testShift, Limits{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Apply with another digest: %v, want invalid argument", err)
	}
	wantGone(t, other)

	// Past the limit: ErrTooLarge (a resource-exhausted error), nothing left.
	small := filepath.Join(t.TempDir(), "rootfs")
	_, err = Apply(ctx, img, d, small, testShift, Limits{MaxBytes: 4096})
	if !errors.Is(err, ErrTooLarge) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("Apply over the limit: %v, want ErrTooLarge", err)
	}
	wantGone(t, small)
}
