package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// TestSetReplicated proves a host records its snapshot's copy over the
// entry another writer made (its fields kept), creates the entry when
// there is none, and cannot record a copy of another host's snapshot.
func TestSetReplicated(t *testing.T) {
	f := startAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	const made, fresh = "n1bbbbbbbbbbbbbbbbbb", "n2bbbbbbbbbbbbbbbbbb"
	if err := d.Put(ctx, Location{Kind: KindSnapshot, ID: made, Host: "b", Tenant: "t1", State: ""}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetReplicated(ctx, Location{ID: made, Host: "b", Digest: "sha256:11"}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetReplicated(ctx, Location{ID: fresh, Host: "b", Tenant: "t2", Digest: "sha256:22"}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]Location{
		made:  {Kind: KindSnapshot, ID: made, Host: "b", Tenant: "t1", Replicated: true, Digest: "sha256:11"},
		fresh: {Kind: KindSnapshot, ID: fresh, Host: "b", Tenant: "t2", Replicated: true, Digest: "sha256:22"},
	} {
		got, err := d.Get(ctx, KindSnapshot, id)
		if err != nil {
			t.Fatal(err)
		}
		got.Updated, got.Revision = time.Time{}, 0
		if got != want {
			t.Errorf("%s: %+v, want %+v", id, got, want)
		}
	}
	if err := d.SetReplicated(ctx, Location{ID: made, Host: "a", Digest: "sha256:33"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("another host's snapshot: %v, want conflict", err)
	}
	if FilesObjectID(made) == made || ValidID("object id", FilesObjectID(made)) != nil {
		t.Errorf("files object id %q", FilesObjectID(made))
	}
}
