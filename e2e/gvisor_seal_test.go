package e2e

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
)

// tokenHolder reads a random token from /tmp/token into its memory,
// deletes the file and marks /tmp/held; whenever /tmp/dump appears it
// writes the token it holds to /tmp/out (so a clone shows what its
// memory holds, not what its files do).
const tokenHolder = `python3 -c '
import os, time
tok = open("/tmp/token").read()
os.unlink("/tmp/token")
open("/tmp/held", "w").write("1")
while True:
    if os.path.exists("/tmp/dump"):
        open("/tmp/out.tmp", "w").write(tok)
        os.rename("/tmp/out.tmp", "/tmp/out")
        os.unlink("/tmp/dump")
    time.sleep(0.02)'`

// execIn runs cmd with /bin/sh -c in session id of the daemon c and
// returns its stdout; a failure fails t.
func execIn(t *testing.T, c *client.Client, id, cmd string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	res, err := c.Exec(ctxFor(t, 2*time.Minute), id, client.ExecRequest{Cmd: cmd}, &out, &errOut)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %v %+v: %s", cmd, id, err, res, errOut.String())
	}
	return out.String()
}

// holdToken starts tokenHolder in session id of c and returns the token
// its memory holds (no file has it any more).
func holdToken(t *testing.T, c *client.Client, id string) string {
	t.Helper()
	tok := strings.TrimSpace(execIn(t, c, id, "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' | tee /tmp/token"))
	if len(tok) != 32 {
		t.Fatalf("token %q", tok)
	}
	if _, err := c.ExecBackground(ctxFor(t, time.Minute), id, client.ExecRequest{Cmd: tokenHolder}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for execIn(t, c, id, "test -f /tmp/held && ! test -e /tmp/token && echo y || true") != "y\n" {
		if time.Now().After(deadline) {
			t.Fatal("the token holder did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return tok
}

// dumpToken asks the token holder restored in session id of c for the
// token in its memory.
func dumpToken(t *testing.T, c *client.Client, id string) string {
	t.Helper()
	return execIn(t, c, id, "touch /tmp/dump; i=0; while ! test -f /tmp/out; do i=$((i+1)); "+
		"[ $i -gt 500 ] && exit 1; sleep 0.02; done; cat /tmp/out")
}

// waitSealed waits until snapshot id of c says its memory is sealed.
func waitSealed(t *testing.T, c *client.Client, id string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		sn, err := c.GetSnapshot(ctxFor(t, time.Minute), id)
		if err != nil {
			t.Fatal(err)
		}
		if sn.MemoryState == "sealed" {
			return
		}
		if sn.MemoryState != "sealing" {
			t.Fatalf("snapshot %s memory_state %q, want sealing or sealed", id, sn.MemoryState)
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot %s not sealed after 2 minutes", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scratchFor lists the entries of the decrypted-image directory (and of
// the plaintext checkpoint directory) of data directory data that belong
// to snapshot id.
func scratchFor(t *testing.T, data, id string) []string {
	t.Helper()
	l := datadir.Layout{Root: data}
	var out []string
	for _, dir := range []string{l.Scratch(), l.CheckpointScratch()} {
		des, _ := os.ReadDir(dir)
		for _, de := range des {
			if strings.Contains(de.Name(), id) {
				out = append(out, filepath.Join(dir, de.Name()))
			}
		}
	}
	return out
}

// TestGVisorRestoreWhileSealing: a memory snapshot answers before its
// checkpoint is sealed (memory_state "sealing"); a restore and a fork
// issued right then wait for the seal and get the snapshot's memory (a
// token only a process's memory holds); the snapshot is then "sealed" on
// disk with no plaintext left; a snapshot deleted while it is being sealed
// leaves nothing behind.
func TestGVisorRestoreWhileSealing(t *testing.T) {
	needGVisor(t)
	o := newOwnDaemonWith(t, nil)
	src, _, err := o.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Isolation: "gvisor"}, "")
	if err != nil {
		t.Fatal(err)
	}
	tok := holdToken(t, o.c, src.ID)
	sn, err := o.c.SnapshotWith(ctxFor(t, 2*time.Minute), src.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	if sn.MemoryState != "sealing" || sn.MemoryBytes <= 0 {
		t.Fatalf("snapshot answer: memory_state %q, memory_bytes %d; want sealing and the checkpoint's size", sn.MemoryState, sn.MemoryBytes)
	}
	clone, _, err := o.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{Snapshot: sn.ID}, "")
	if err != nil {
		t.Fatalf("restore issued while sealing: %v", err)
	}
	if got := dumpToken(t, o.c, clone.ID); got != tok {
		t.Fatalf("restored memory holds %q, want %q", got, tok)
	}
	got, err := o.c.GetSnapshot(ctxFor(t, time.Minute), sn.ID)
	if err != nil || got.MemoryState != "sealed" {
		t.Fatalf("after a restore the snapshot is %+v (%v), want sealed", got, err)
	}
	if _, err := os.Stat(filepath.Join(o.dataDir, "memory", sn.ID, "manifest.json")); err != nil {
		t.Fatalf("sealed checkpoint: %v", err)
	}
	if left := scratchFor(t, o.dataDir, sn.ID); len(left) > 0 {
		t.Fatalf("plaintext left after the seal and the restore (no image cache): %v", left)
	}

	// A fork issued right after the answer.
	sn2, err := o.c.SnapshotWith(ctxFor(t, 2*time.Minute), src.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := o.c.ForkSnapshot(ctxFor(t, 3*time.Minute), sn2.ID, client.ForkRequest{Count: 2})
	if err != nil {
		t.Fatalf("fork issued while sealing: %v", err)
	}
	for _, s := range res.Sessions {
		if got := dumpToken(t, o.c, s.ID); got != tok {
			t.Fatalf("fork %s holds %q, want %q", s.ID, got, tok)
		}
	}

	// Deleted while sealing: nothing of it stays.
	sn3, err := o.c.SnapshotWith(ctxFor(t, 2*time.Minute), src.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.c.DeleteSnapshot(ctxFor(t, time.Minute), sn3.ID, false); err != nil {
		t.Fatalf("delete while sealing: %v", err)
	}
	if _, err := o.c.GetSnapshot(ctxFor(t, time.Minute), sn3.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted snapshot: %v", err)
	}
	if _, err := os.Stat(filepath.Join(o.dataDir, "memory", sn3.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a snapshot deleted while sealing left its sealed checkpoint (%v)", err)
	}
	if left := scratchFor(t, o.dataDir, sn3.ID); len(left) > 0 {
		t.Fatalf("a snapshot deleted while sealing left plaintext: %v", left)
	}
}

// TestGVisorImageCache: with an image cache, a new memory snapshot's
// decrypted copy is kept (in the tmpfs scratch directory, root-only) and
// restores use it; a byte flipped in the sealed checkpoint makes a restore
// refuse it all the same (the copy is dropped and the sealed files are
// verified again); deleting the snapshot removes the copy.
func TestGVisorImageCache(t *testing.T) {
	needGVisor(t)
	o := newOwnDaemonWith(t, func(opts *daemon.Options) { opts.MemoryImageCacheMB = 512 })
	src, _, err := o.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Isolation: "gvisor"}, "")
	if err != nil {
		t.Fatal(err)
	}
	tok := holdToken(t, o.c, src.ID)
	sn, err := o.c.SnapshotWith(ctxFor(t, 2*time.Minute), src.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	waitSealed(t, o.c, sn.ID)
	scratch := datadir.Layout{Root: o.dataDir}.Scratch()
	kept := scratchFor(t, o.dataDir, sn.ID)
	if len(kept) != 1 || filepath.Dir(kept[0]) != scratch {
		t.Fatalf("decrypted copies of a new snapshot: %v, want one in %s", kept, scratch)
	}
	st, err := os.Stat(kept[0])
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("the kept copy's directory: %v %v, want mode 0700", st, err)
	}
	for i := 0; i < 2; i++ {
		clone, _, err := o.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{Snapshot: sn.ID}, "")
		if err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		if got := dumpToken(t, o.c, clone.ID); got != tok {
			t.Fatalf("restore %d holds %q, want %q", i, got, tok)
		}
		_ = o.c.DeleteSession(ctxFor(t, time.Minute), clone.ID)
	}

	// Tampered after the copy was made: refused.
	dir := filepath.Join(o.dataDir, "memory", sn.ID)
	files, _ := os.ReadDir(dir)
	var biggest string
	var size int64
	for _, f := range files {
		if info, err := f.Info(); err == nil && info.Size() > size && f.Name() != "manifest.json" {
			biggest, size = filepath.Join(dir, f.Name()), info.Size()
		}
	}
	orig, err := os.ReadFile(biggest)
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), orig...)
	bad[len(bad)/2] ^= 0x40
	if err := os.WriteFile(biggest, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := o.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{Snapshot: sn.ID}, ""); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "integrity") {
		t.Fatalf("restore of a tampered snapshot with a kept copy: %v, want an integrity failure", err)
	}
	if err := os.WriteFile(biggest, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	clone, _, err := o.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{Snapshot: sn.ID}, "")
	if err != nil {
		t.Fatalf("restore once repaired: %v", err)
	}
	_ = o.c.DeleteSession(ctxFor(t, time.Minute), clone.ID)
	if len(scratchFor(t, o.dataDir, sn.ID)) != 1 {
		t.Fatalf("no decrypted copy kept after a restore: %v", scratchFor(t, o.dataDir, sn.ID))
	}
	if err := o.c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true); err != nil {
		t.Fatal(err)
	}
	if left := scratchFor(t, o.dataDir, sn.ID); len(left) > 0 {
		t.Fatalf("a deleted snapshot's decrypted copy stays: %v", left)
	}
}
