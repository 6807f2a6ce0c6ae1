package e2e

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/route"
	"github.com/forkbox/forkbox/tenancy"
)

// TestDirectorySync: route.Tracked over the test daemon's real Node and
// a real directory (an embedded JetStream alone) writes the entry of
// every live session, removes those of sessions that ended without it
// (destroyed past it, as a timeout or the janitor would) and stale ones
// of this host, keeps other hosts' entries and this host's terminated
// ones, keeps the entry of a session another tenant's destroy was told
// not-found for and another host's entry of a snapshot held here (an
// import), and removes an entry at once when a destroy goes through it.
func TestDirectorySync(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 2*time.Minute)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, err := fleet.Start(ctx, fleet.Options{StoreDir: t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	dir, err := fleet.OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	tr := route.NewTracked(env.d.Manager(), "h1", func() (*fleet.Directory, error) { return dir, nil }, log)
	has := func(kind fleet.Kind, id string) (fleet.Location, bool) {
		l, err := dir.Get(ctx, kind, id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return l, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return l, true
	}
	for _, l := range []fleet.Location{
		{Kind: fleet.KindSession, ID: "stalesession0000000a", Host: "h1"},
		{Kind: fleet.KindSnapshot, ID: "stalesnapshot000000a", Host: "h1"},
		{Kind: fleet.KindSession, ID: "elsewhere00000000000", Host: "h2"},
		{Kind: fleet.KindSession, ID: "lostsession000000000", Host: "h1", State: fleet.LocationTerminated, Reason: fleet.ReasonHostLost},
	} {
		if err := dir.Put(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	s1 := newSession(t, client.CreateRequest{})
	s2 := newSession(t, client.CreateRequest{})
	if err := tr.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{s1.ID, s2.ID} {
		rec, err := env.d.Manager().Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if l, ok := has(fleet.KindSession, id); !ok || l.Host != "h1" || l.Tenant != rec.Tenant {
			t.Errorf("session %s after sync: %+v %v", id, l, ok)
		}
	}
	for _, c := range []struct {
		kind fleet.Kind
		id   string
		want bool
	}{
		{fleet.KindSession, "stalesession0000000a", false}, {fleet.KindSnapshot, "stalesnapshot000000a", false},
		{fleet.KindSession, "elsewhere00000000000", true}, {fleet.KindSession, "lostsession000000000", true},
	} {
		if _, ok := has(c.kind, c.id); ok != c.want {
			t.Errorf("%s %s after sync: present %v, want %v", c.kind, c.id, ok, c.want)
		}
	}
	// Another tenant's destroy is told not-found and leaves the entry.
	other := tenancy.With(ctx, tenancy.Caller{Tenant: "someone-else", KeyID: "k"})
	if err := tr.Destroy(other, s1.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's destroy: %v, want not-found", err)
	}
	if _, ok := has(fleet.KindSession, s1.ID); !ok {
		t.Fatal("another tenant's destroy (not-found) removed the live session's entry")
	}
	// A destroy through the Node: gone at once.
	if err := tr.Destroy(ctx, s1.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := has(fleet.KindSession, s1.ID); ok {
		t.Error("destroyed through Tracked, the entry is still there")
	}
	// A snapshot held here whose entry names another host (one imported
	// from it): a sync leaves that host's entry as it is, and a delete of
	// this host's copy does not remove it.
	sn, err := env.c.Snapshot(ctx, s2.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := fleet.Location{Kind: fleet.KindSnapshot, ID: sn.ID, Host: "h2", Tenant: "default", Replicated: true, Digest: "sha256-of-h2s-copy"}
	if err := dir.Put(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	if err := tr.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if l, ok := has(fleet.KindSnapshot, sn.ID); !ok || l.Host != "h2" || !l.Replicated || l.Digest != theirs.Digest {
		t.Errorf("another host's entry of a snapshot held here, after a sync: %+v %v, want %+v", l, ok, theirs)
	}
	if err := tr.DeleteSnapshot(ctx, sn.ID, false); err != nil {
		t.Fatal(err)
	}
	if l, ok := has(fleet.KindSnapshot, sn.ID); !ok || l.Host != "h2" {
		t.Errorf("another host's entry after this host's copy was deleted: %+v %v, want it kept", l, ok)
	}
	// Ended past it: gone at the next sync.
	if err := env.c.DeleteSession(ctx, s2.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := has(fleet.KindSession, s2.ID); !ok {
		t.Fatal("the entry went without a sync")
	}
	if err := tr.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := has(fleet.KindSession, s2.ID); ok {
		t.Error("a session that ended past Tracked keeps its entry after a sync")
	}
}

// TestDirectoryImportedSnapshot: a snapshot this host holds whose entry
// names another host (a copy imported here from that host's replica)
// keeps that host's entry, replicated with its digest, through a sync
// and through its deletion here (both overwrote it: the owner's copy
// could then be imported nowhere else, nor its objects deleted).
func TestDirectoryImportedSnapshot(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 2*time.Minute)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, err := fleet.Start(ctx, fleet.Options{StoreDir: t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	dir, err := fleet.OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	tr := route.NewTracked(env.d.Manager(), "h1", func() (*fleet.Directory, error) { return dir, nil }, log)
	s := newSession(t, client.CreateRequest{})
	sn, err := env.c.Snapshot(ctx, s.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	owner := fleet.Location{Kind: fleet.KindSnapshot, ID: sn.ID, Host: "h2", Replicated: true, Digest: "sha256:00"}
	if err := dir.Put(ctx, owner); err != nil {
		t.Fatal(err)
	}
	still := func(when string) {
		t.Helper()
		l, err := dir.Get(ctx, fleet.KindSnapshot, sn.ID)
		if err != nil || l.Host != "h2" || !l.Replicated || l.Digest != owner.Digest {
			t.Fatalf("%s: the owner's entry is %+v (%v), want h2's, replicated", when, l, err)
		}
	}
	if err := tr.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	still("after a sync")
	if err := tr.DeleteSnapshot(ctx, sn.ID, false); err != nil {
		t.Fatal(err)
	}
	still("after the imported copy's delete")
}
