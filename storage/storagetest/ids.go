package storagetest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// badIDs are ids every driver refuses (storage.ValidID): empty, path
// tricks, a temporary entry's name, a metadata file's name, too long.
var badIDs = []string{"", "../x", "a/b", ".hidden", "-x", "x.json", "a b", strings.Repeat("x", storage.MaxIDLength+1)}

// testIDs: every driver takes the longest valid id and refuses the same
// bad ones for layers, snapshots and templates with ErrInvalidArgument,
// leaving nothing behind.
func (s *suite) testIDs(t *testing.T) {
	ctx := context.Background()
	long := strings.Repeat("l", storage.MaxIDLength)
	if _, err := s.d.Prepare(ctx, long, storage.Source{Template: templateName}, 0); err != nil {
		t.Fatalf("Prepare with a %d-byte id: %v", len(long), err)
	}
	defer s.d.Remove(ctx, long)
	if _, err := s.d.Snapshot(ctx, long, long, nil); err != nil {
		t.Fatalf("Snapshot with %d-byte ids: %v", len(long), err)
	}
	defer s.d.RemoveSnapshot(ctx, long)
	invalid := func(what, id string, err error) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s with id %q: %v, want invalid argument", what, id, err)
		}
	}
	for _, bad := range badIDs {
		_, err := s.d.Prepare(ctx, bad, storage.Source{Template: templateName}, 0)
		invalid("Prepare", bad, err)
		_, err = s.d.Prepare(ctx, "idcheck", storage.Source{Snapshot: bad}, 0)
		invalid("Prepare from snapshot", bad, err)
		_, err = s.d.Prepare(ctx, "idcheck", storage.Source{Template: bad}, 0)
		invalid("Prepare from template", bad, err)
		_, err = s.d.Snapshot(ctx, long, bad, nil)
		invalid("Snapshot", bad, err)
		invalid("Verify", bad, s.d.Verify(ctx, bad))
		invalid("AddTemplate", bad, s.d.AddTemplate(ctx, bad, s.dir, "v1"))
	}
	layers, err := s.d.Layers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := s.d.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range append(badIDs, "idcheck") {
		if contains(layers, bad) || contains(snaps, bad) {
			t.Fatalf("a refused id %q was kept: layers %v, snapshots %v", bad, layers, snaps)
		}
	}
}
