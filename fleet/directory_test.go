package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// TestDirectory writes, reads, lists, updates by compare-and-set and
// deletes entries of a real embedded JetStream, and marks a lost host's
// sessions terminated while its snapshots and other hosts' sessions stay.
func TestDirectory(t *testing.T) {
	f := startAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	put := func(l Location) {
		t.Helper()
		if err := d.Put(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	put(Location{Kind: KindSession, ID: "s1aaaaaaaaaaaaaaaaaa", Host: "a", Tenant: "t1"})
	put(Location{Kind: KindSession, ID: "s2aaaaaaaaaaaaaaaaaa", Host: "c"})
	put(Location{Kind: KindSession, ID: "s3aaaaaaaaaaaaaaaaaa", Host: "c"})
	put(Location{Kind: KindSnapshot, ID: "n1aaaaaaaaaaaaaaaaaa", Host: "c", Replicated: true, Digest: "sha256:00"})

	for _, bad := range []Location{
		{Kind: "volume", ID: "s1aaaaaaaaaaaaaaaaaa", Host: "a"},
		{Kind: KindSession, ID: "../x", Host: "a"},
		{Kind: KindSession, ID: "s9aaaaaaaaaaaaaaaaaa", Host: "A B"},
	} {
		if err := d.Put(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Put(%+v) = %v, want invalid argument", bad, err)
		}
	}
	if _, err := d.Get(ctx, KindSession, "nosuchaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get of a missing id = %v, want not found", err)
	}
	l, err := d.Get(ctx, KindSession, "s1aaaaaaaaaaaaaaaaaa")
	if err != nil || l.Host != "a" || l.Tenant != "t1" || l.Revision == 0 || l.Updated.IsZero() {
		t.Fatalf("Get = %+v, %v", l, err)
	}
	stale := l
	l.Tenant = "t2"
	if err := d.Update(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ctx, stale); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Update over a stale revision = %v, want conflict", err)
	}

	marked, err := d.MarkHostLost(ctx, "c")
	if err != nil || len(marked) != 2 {
		t.Fatalf("MarkHostLost = %v, %v; want the 2 sessions of c", marked, err)
	}
	all, err := d.List(ctx, "", nil)
	if err != nil || len(all) != 4 {
		t.Fatalf("List = %v, %v", all, err)
	}
	for _, l := range all {
		lost := l.Kind == KindSession && l.Host == "c"
		if lost != (l.State == LocationTerminated && l.Reason == ReasonHostLost) {
			t.Errorf("after c was lost: %+v", l)
		}
	}
	if again, err := d.MarkHostLost(ctx, "c"); err != nil || len(again) != 0 {
		t.Errorf("second MarkHostLost = %v, %v; want none", again, err)
	}
	snaps, err := d.List(ctx, KindSnapshot, nil)
	if err != nil || len(snaps) != 1 || !snaps[0].Replicated {
		t.Errorf("List(snapshots) = %v, %v", snaps, err)
	}
	// Claim writes only a new id; DeleteOwned leaves another host's
	// entry (a copy of c's snapshot deleted on a).
	if wrote, err := d.Claim(ctx, Location{Kind: KindSnapshot, ID: "n1aaaaaaaaaaaaaaaaaa", Host: "a"}); err != nil || wrote {
		t.Errorf("Claim over c's snapshot = %v, %v; want no write", wrote, err)
	}
	if wrote, err := d.Claim(ctx, Location{Kind: KindSnapshot, ID: "n2aaaaaaaaaaaaaaaaaa", Host: "a"}); err != nil || !wrote {
		t.Errorf("Claim of a new snapshot = %v, %v", wrote, err)
	}
	if err := d.DeleteOwned(ctx, KindSnapshot, "n1aaaaaaaaaaaaaaaaaa", "a"); err != nil {
		t.Fatal(err)
	}
	if l, err := d.Get(ctx, KindSnapshot, "n1aaaaaaaaaaaaaaaaaa"); err != nil || l.Host != "c" || !l.Replicated {
		t.Errorf("c's snapshot after a's DeleteOwned: %+v, %v", l, err)
	}
	if err := d.DeleteOwned(ctx, KindSnapshot, "n2aaaaaaaaaaaaaaaaaa", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(ctx, KindSnapshot, "n2aaaaaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a's snapshot after its DeleteOwned: %v", err)
	}
	if err := d.DeleteOwned(ctx, KindSnapshot, "n2aaaaaaaaaaaaaaaaaa", "a"); err != nil {
		t.Errorf("DeleteOwned of a missing entry = %v", err)
	}
	if err := d.Delete(ctx, KindSession, "s1aaaaaaaaaaaaaaaaaa"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, KindSession, "s1aaaaaaaaaaaaaaaaaa"); err != nil {
		t.Errorf("second Delete = %v", err)
	}
	if _, err := d.Get(ctx, KindSession, "s1aaaaaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Delete = %v", err)
	}
}
