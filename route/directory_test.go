package route

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/forkbox/forkbox/fleet"
)

// TestTrackedSnapshotKeepsReplicated: the entry Tracked writes after a
// snapshot call does not undo the record of its copy when the background
// copy to the object store finished first (SetReplicated), nor replace
// another host's entry.
func TestTrackedSnapshotKeepsReplicated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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
	tr := NewTracked(nil, "h1", func() (*fleet.Directory, error) { return dir, nil }, log)
	if err := dir.SetReplicated(ctx, fleet.Location{ID: "copiedfirst000000000", Host: "h1", Tenant: "acme", Digest: "sha256:01"}); err != nil {
		t.Fatal(err)
	}
	if err := dir.Put(ctx, fleet.Location{Kind: fleet.KindSnapshot, ID: "elsewhere00000000000", Host: "h2", Replicated: true, Digest: "sha256:02"}); err != nil {
		t.Fatal(err)
	}
	tr.put(ctx, fleet.KindSnapshot, "copiedfirst000000000", "acme")
	tr.put(ctx, fleet.KindSnapshot, "elsewhere00000000000", "acme")
	tr.put(ctx, fleet.KindSnapshot, "fresh000000000000000", "acme")
	for id, want := range map[string]fleet.Location{
		"copiedfirst000000000": {Host: "h1", Replicated: true, Digest: "sha256:01"},
		"elsewhere00000000000": {Host: "h2", Replicated: true, Digest: "sha256:02"},
		"fresh000000000000000": {Host: "h1"},
	} {
		l, err := dir.Get(ctx, fleet.KindSnapshot, id)
		if err != nil || l.Host != want.Host || l.Replicated != want.Replicated || l.Digest != want.Digest {
			t.Errorf("%s after Tracked's write: %+v (%v), want host %s replicated %v digest %q", id, l, err, want.Host, want.Replicated, want.Digest)
		}
	}
}
