package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/storage/seal"
)

// TestFleetCorruptSnapshotRefused runs two `forkbox serve` hosts on a
// NATS server with JetStream of the test's own (--nats), so that the test
// reaches the object store as a host does. A files snapshot taken on b
// is copied there; the test replaces the stored export with one whose
// archive bytes were altered (its manifest rewritten to match, so the
// object store's own checks pass), and a fork of it on a is refused with
// 409 for failing its integrity check: no session starts and a records
// no snapshot. With the real export put back, the same fork works.
func TestFleetCorruptSnapshotRefused(t *testing.T) {
	need(t)
	tmp, err := os.MkdirTemp("", "forkbox-fleet-bad-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o711)
	token := make([]byte, 16)
	rand.Read(token)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: filepath.Join(tmp, "nats"), Authorization: hex.EncodeToString(token), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the test's NATS server did not start")
	}
	url := fmt.Sprintf("nats://%s@%s", hex.EncodeToString(token), ns.Addr().String())
	key := make([]byte, 32)
	rand.Read(key)
	t.Setenv(seal.KeyEnv, hex.EncodeToString(key))
	ids := []string{"a", "b"}
	procs := make([]*serveProc, len(ids))
	var f *fleet.Fleet
	t.Cleanup(func() {
		for i, p := range procs {
			if p != nil {
				p.stop()
			}
			data := filepath.Join(tmp, ids[i])
			if out, err := exec.Command(env.cli, "down", "--data-dir", data).CombinedOutput(); err != nil {
				t.Errorf("forkbox down %s: %v: %s", ids[i], err, out)
			}
			_ = daemon.ReleaseStorage(data)
			os.RemoveAll(datadir.Layout{Root: data}.Scratch())
		}
		if f != nil {
			f.Close()
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		os.RemoveAll(tmp)
	})
	for i, id := range ids {
		p, err := startServe(t, filepath.Join(tmp, id), "--storage-size", "1", "--spares", "0", "--stop-sessions",
			"--nats", url, "--node-id", id)
		if err != nil {
			t.Fatalf("host %s: %v", id, err)
		}
		procs[i] = p
	}
	a, b := procs[0], procs[1]
	f, err = fleet.Start(ctxFor(t, time.Minute), fleet.Options{URL: url, NodeID: "e2e"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := fleet.OpenObjects(ctxFor(t, time.Minute), f)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := fleet.OpenDirectory(ctxFor(t, time.Minute), f)
	if err != nil {
		t.Fatal(err)
	}

	src, _, err := b.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Host: "b"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.ExecCollect(ctxFor(t, time.Minute), src.ID, client.ExecRequest{Cmd: "echo written-on-b > /home/user/note.txt"}); err != nil {
		t.Fatal(err)
	}
	sn, err := b.c.Snapshot(ctxFor(t, time.Minute), src.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var loc fleet.Location
	waitUntil(t, 2*time.Minute, "b's snapshot is replicated", func() bool {
		loc, err = dir.Get(ctxFor(t, time.Minute), fleet.KindSnapshot, sn.ID)
		return err == nil && loc.Replicated
	})
	good := filepath.Join(tmp, "good")
	if err := objs.Get(ctxFor(t, time.Minute), fleet.FilesObjectID(sn.ID), loc.Digest, good); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(tmp, "bad")
	badDigest := alteredExport(t, good, bad)
	if err := objs.Put(ctxFor(t, time.Minute), fleet.FilesObjectID(sn.ID), bad, badDigest); err != nil {
		t.Fatal(err)
	}

	_, err = a.c.ForkSnapshot(ctxFor(t, 2*time.Minute), sn.ID, client.ForkRequest{Count: 1})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "integrity check") {
		t.Fatalf("fork of an altered copy on a: %v, want 409 failing its integrity check", err)
	}
	if ss, err := a.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{}); err != nil || len(ss) != 0 {
		t.Fatalf("a runs %d sessions after the refusal (%v)", len(ss), err)
	}
	if list, err := a.c.Snapshots(ctxFor(t, time.Minute)); err != nil || len(list) != 0 {
		t.Fatalf("a holds %d snapshots after the refusal (%v)", len(list), err)
	}

	if err := objs.Put(ctxFor(t, time.Minute), fleet.FilesObjectID(sn.ID), good, loc.Digest); err != nil {
		t.Fatal(err)
	}
	res, err := a.c.ForkSnapshot(ctxFor(t, 2*time.Minute), sn.ID, client.ForkRequest{Count: 1})
	if err != nil {
		t.Fatalf("fork of the real copy: %v", err)
	}
	if got := catNote(t, a, res.Sessions[0].ID); got != "written-on-b" {
		t.Fatalf("the child on a reads %q", got)
	}
	if err := a.c.DeleteSession(ctxFor(t, time.Minute), res.Sessions[0].ID); err != nil {
		t.Fatal(err)
	}
}

// alteredExport copies the sealed export good into bad with one byte of
// its archive flipped and its manifest rewritten to match, and returns
// the new manifest's digest.
func alteredExport(t *testing.T, good, bad string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(good, seal.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	m, err := seal.ParseManifest(data, "sha256:"+hex.EncodeToString(sum[:]))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(bad, 0o700); err != nil {
		t.Fatal(err)
	}
	for i, fl := range m.Files {
		b, err := os.ReadFile(filepath.Join(good, fl.Name))
		if err != nil {
			t.Fatal(err)
		}
		if fl.Name == "files.tar" {
			b[len(b)/2] ^= 0x01
			s := sha256.Sum256(b)
			m.Files[i].SHA256 = hex.EncodeToString(s[:])
		}
		if err := os.WriteFile(filepath.Join(bad, fl.Name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	digest, err := seal.WriteManifest(bad, m.Files)
	if err != nil {
		t.Fatal(err)
	}
	return digest
}
