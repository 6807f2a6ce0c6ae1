package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/tenancy"
)

// fleetPair is two hosts' snapshot services (a and b, each with its own
// data directory, store and overlay driver, one snapshot key) sharing a
// real embedded JetStream: its object store and directory, a cache each.
type fleetPair struct {
	a, b *env
	objs *fleet.JetStreamObjects
	dir  *fleet.Directory
}

func newFleetPair(t *testing.T) *fleetPair {
	t.Helper()
	a, b := newEnv(t), newEnv(t)
	b.s.key = a.s.key
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, err := fleet.Start(ctx, fleet.Options{StoreDir: t.TempDir()}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	objs, err := fleet.OpenObjects(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := fleet.OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		e    *env
		self string
	}{{a, "a"}, {b, "b"}} {
		cache, err := fleet.OpenCache(filepath.Join(h.e.layout.Root, "fleet", "cache"), 64<<20, objs)
		if err != nil {
			t.Fatal(err)
		}
		h.e.s.replicas = &fleet.SnapshotReplicas{Self: h.self, Objects: objs, Cache: cache, Log: quiet,
			Directory: func() (*fleet.Directory, error) { return dir, nil }}
	}
	return &fleetPair{a: a, b: b, objs: objs, dir: dir}
}

// readTree returns file rel of snapshot id's tree on e's driver.
func readTree(t *testing.T, e *env, id, rel string) (string, error) {
	t.Helper()
	dir, release, err := e.drv.(storage.Trees).SnapshotTree(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	b, err := os.ReadFile(filepath.Join(dir, rel))
	return string(b), err
}

// TestReplicatedSnapshotForksElsewhere proves a files snapshot taken on
// host a (a file written and a template file deleted in its session, on a
// parent snapshot) and recorded without a copy is copied to the object
// store by the copies resumed at start-up and recorded replicated in the
// directory (its parent too; b's start-up copies none of what it
// imported); a fork of its id on host b, which never had it,
// imports it (files, deletion, its record's tenant) and starts b's own
// sessions; deleting b's copy leaves the fleet's, deleting a's removes
// the objects and the entry.
func TestReplicatedSnapshotForksElsewhere(t *testing.T) {
	p := newFleetPair(t)
	ctx := context.Background()
	p.a.layer(t, "sess1aaaaaaaaaaaaaaa", storage.Source{Template: testTemplate}, "first.txt", "one")
	parent := p.a.snap(t, "sess1aaaaaaaaaaaaaaa", "default", nil)
	p.a.layer(t, "sess2aaaaaaaaaaaaaaa", storage.Source{Snapshot: parent.ID}, "notes.txt", "written on a")
	if err := os.Remove(filepath.Join(mustLayerTree(t, p.a, "sess2aaaaaaaaaaaaaaa"), "etc", "hello")); err != nil {
		t.Fatal(err)
	}
	sn := p.a.snap(t, "sess2aaaaaaaaaaaaaaa", "default", nil)
	// Recorded without a copy (as after a daemon that stopped before
	// its copy ended): the copies resumed at start-up make it.
	p.a.s.resumeCopies(ctx)
	p.a.s.bg.Wait()
	loc, err := p.dir.Get(ctx, fleet.KindSnapshot, sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !loc.Replicated || loc.Host != "a" || loc.Digest == "" {
		t.Fatalf("directory entry %+v: want replicated on a with a digest", loc)
	}

	kids, err := p.b.s.Fork(ctx, sn.ID, 2, node.CreateSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 || kids[0].Snapshot != sn.ID {
		t.Fatalf("forks %+v", kids)
	}
	got, err := p.b.st.GetSnapshot(ctx, sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "default" || got.Template != testTemplate || got.Parent != "" || got.Storage != p.b.drv.Name() {
		t.Errorf("imported record %+v", got)
	}
	for rel, want := range map[string]string{"home/user/notes.txt": "written on a", "home/user/first.txt": "one"} {
		if s, err := readTree(t, p.b, sn.ID, rel); err != nil || s != want {
			t.Errorf("imported %s = %q, %v; want %q", rel, s, err, want)
		}
	}
	if _, err := readTree(t, p.b, sn.ID, "etc/hello"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file deleted before the snapshot is back on b: %v", err)
	}

	// b copies nothing of an imported snapshot at its start-up.
	p.b.s.resumeCopies(ctx)
	p.b.s.bg.Wait()
	if l, err := p.dir.Get(ctx, fleet.KindSnapshot, sn.ID); err != nil || l.Host != "a" || l.Digest != loc.Digest {
		t.Errorf("after b's start-up copies, entry %+v (%v): want a's, unchanged", l, err)
	}

	for _, k := range kids {
		if err := p.b.core.Destroy(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.b.s.DeleteSnapshot(ctx, sn.ID, true); err != nil {
		t.Fatal(err)
	}
	p.b.s.bg.Wait()
	if _, err := p.dir.Get(ctx, fleet.KindSnapshot, sn.ID); err != nil {
		t.Errorf("deleting b's imported copy removed the fleet's entry: %v", err)
	}
	if err := p.a.s.DeleteSnapshot(ctx, sn.ID, true); err != nil {
		t.Fatal(err)
	}
	p.a.s.bg.Wait()
	if _, err := p.dir.Get(ctx, fleet.KindSnapshot, sn.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("entry after a deleted its snapshot: %v", err)
	}
	err = p.objs.Get(ctx, fleet.FilesObjectID(sn.ID), loc.Digest, filepath.Join(t.TempDir(), "x"))
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("objects after a deleted its snapshot: %v", err)
	}
}

// TestReplicatedSnapshotCorruptRefused proves a fork from a snapshot whose
// stored export was replaced by an altered one (its archive's bytes
// changed, the manifest made to match) is refused with ErrConflict
// before anything starts: no record, no storage snapshot, no session on
// the importing host.
func TestReplicatedSnapshotCorruptRefused(t *testing.T) {
	p := newFleetPair(t)
	ctx := context.Background()
	p.a.layer(t, "sess3aaaaaaaaaaaaaaa", storage.Source{Template: testTemplate}, "secret.txt", "payload")
	sn := p.a.snap(t, "sess3aaaaaaaaaaaaaaa", "default", nil)
	p.a.s.copyFiles(ctx, sn)
	loc, err := p.dir.Get(ctx, fleet.KindSnapshot, sn.ID)
	if err != nil || !loc.Replicated {
		t.Fatalf("entry %+v, %v", loc, err)
	}
	// An altered export under the same object id.
	bad := filepath.Join(t.TempDir(), "bad")
	if _, _, err := p.a.s.exportFiles(ctx, sn, bad); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(bad, seal.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	m, err := seal.ParseManifest(data, digestOf(data))
	if err != nil {
		t.Fatal(err)
	}
	arch := filepath.Join(bad, filesArchive)
	b, err := os.ReadFile(arch)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(arch, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range m.Files {
		if m.Files[i].Name == filesArchive {
			m.Files[i].SHA256 = sha256Hex(b)
		}
	}
	os.Remove(filepath.Join(bad, seal.ManifestName))
	badDigest, err := seal.WriteManifest(bad, m.Files)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.objs.Put(ctx, fleet.FilesObjectID(sn.ID), bad, badDigest); err != nil {
		t.Fatal(err)
	}

	_, err = p.b.s.Fork(ctx, sn.ID, 1, node.CreateSpec{})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("fork of an altered copy: %v, want conflict (integrity check)", err)
	}
	if !strings.Contains(err.Error(), "integrity check") {
		t.Errorf("refused for another reason: %v", err)
	}
	records, files := p.b.stored(t, sn.ID)
	if records[sn.ID] || files[sn.ID] {
		t.Errorf("the refused copy left a record (%v) or files (%v)", records[sn.ID], files[sn.ID])
	}
	if sess, _ := p.b.st.ListSessions(ctx, node.SessionFilter{}); len(sess) != 0 {
		t.Errorf("sessions started from a refused copy: %d", len(sess))
	}
	layers, err := p.b.drv.Layers(ctx)
	if err != nil || len(layers) != 0 {
		t.Errorf("layers left: %v, %v", layers, err)
	}
}

func mustLayerTree(t *testing.T, e *env, id string) string {
	t.Helper()
	dir, err := e.drv.(storage.Trees).LayerTree(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func digestOf(b []byte) string { return "sha256:" + sha256Hex(b) }

// TestImportedMeanwhileOtherTenant: a caller of another tenant whose
// import of a snapshot waited on one made meanwhile for its owner is not
// handed that snapshot (ErrNotFound, as for any snapshot not its own).
func TestImportedMeanwhileOtherTenant(t *testing.T) {
	p := newFleetPair(t)
	ctx := context.Background()
	p.a.layer(t, "sess1aaaaaaaaaaaaaaa", storage.Source{Template: testTemplate}, "first.txt", "one")
	sn := p.a.snap(t, "sess1aaaaaaaaaaaaaaa", "default", nil)
	p.a.s.resumeCopies(ctx)
	p.a.s.bg.Wait()
	owner := tenancy.With(ctx, tenancy.Caller{Tenant: "default"})
	if _, err := p.b.s.importRemote(owner, sn.ID); err != nil {
		t.Fatal(err)
	}
	other := tenancy.With(ctx, tenancy.Caller{Tenant: "other"})
	if got, err := p.b.s.importRemote(other, sn.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's import of a snapshot imported meanwhile: %+v, %v; want ErrNotFound", got, err)
	}
}

// TestImportWaitEndsWithCaller: a caller waiting for its turn behind an
// import under way gives up when its context ends (it was parked until
// the other import finished, however long that took).
func TestImportWaitEndsWithCaller(t *testing.T) {
	p := newFleetPair(t)
	p.b.s.importing <- struct{}{} // an import under way
	defer func() { <-p.b.s.importing }()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.b.s.importRemote(ctx, "bxnlnzujoad772b2iwya")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait for an import's turn: %v, want the caller's deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a caller waiting for an import's turn did not give up with its context")
	}
}

// TestForgetReplicaWhileUnavailable: a snapshot deleted while the fleet
// has no quorum has its objects deleted from the object store once it is
// back (they were kept for ever, and its export could still be pulled).
func TestForgetReplicaWhileUnavailable(t *testing.T) {
	p := newFleetPair(t)
	ctx := context.Background()
	p.a.layer(t, "sess1aaaaaaaaaaaaaaa", storage.Source{Template: testTemplate}, "first.txt", "one")
	sn := p.a.snap(t, "sess1aaaaaaaaaaaaaaa", "default", nil)
	p.a.s.resumeCopies(ctx)
	p.a.s.bg.Wait()
	loc, err := p.dir.Get(ctx, fleet.KindSnapshot, sn.ID)
	if err != nil || !loc.Replicated {
		t.Fatalf("entry %+v (%v): want replicated", loc, err)
	}
	r := p.a.s.replicas.(*fleet.SnapshotReplicas)
	var mu sync.Mutex
	down := 1 // the first ask for the directory finds no quorum
	r.Directory = func() (*fleet.Directory, error) {
		mu.Lock()
		defer mu.Unlock()
		if down > 0 {
			down--
			return nil, errdefs.Newf(errdefs.ErrUnavailable, "fleet: no quorum")
		}
		return p.dir, nil
	}
	if err := p.a.s.DeleteSnapshot(ctx, sn.ID, true); err != nil {
		t.Fatal(err)
	}
	p.a.s.bg.Wait()
	err = p.objs.Get(ctx, fleet.FilesObjectID(sn.ID), loc.Digest, filepath.Join(t.TempDir(), "x"))
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("objects of a snapshot deleted while the fleet had no quorum: %v, want gone", err)
	}
}
