package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
)

// TestGVisorSealKilled kills the daemon (SIGKILL) right after a gVisor
// memory snapshot answered, while its checkpoint is being sealed, and
// proves the next daemon leaves no snapshot that could be restored
// without a digest: the snapshot is either gone with everything of it
// (the sealed directory, the plaintext in either scratch directory) or
// sealed and restorable; the session it came from runs on.
func TestGVisorSealKilled(t *testing.T) {
	needGVisor(t)
	tmp, err := os.MkdirTemp("", "forkbox-seal-kill-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o711)
	data := filepath.Join(tmp, "data")
	args := []string{"--storage-size", "4"}
	var live *serveProc
	t.Cleanup(func() {
		if live == nil {
			live, _ = startServe(t, data, args...)
		}
		if live != nil {
			live.stop()
		}
		_ = daemon.ReleaseStorage(data)
		os.RemoveAll(datadir.Layout{Root: data}.Scratch())
		os.RemoveAll(tmp)
	})
	if live, err = startServe(t, data, args...); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 10*time.Minute)
	src, _, err := live.c.CreateSession(ctx, client.CreateRequest{Isolation: "gvisor", MemoryMB: 512}, "")
	if err != nil {
		t.Fatal(err)
	}
	// Memory to seal: the seal then takes long enough to be killed in.
	if _, err := live.c.ExecBackground(ctx, src.ID, client.ExecRequest{Cmd: `python3 -c 'import os,time; b=bytearray(os.urandom(200<<20)); open("/tmp/held","w").write("1"); time.sleep(3600)'`}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for execIn(t, live.c, src.ID, "test -f /tmp/held && echo y || true") != "y\n" {
		if time.Now().After(deadline) {
			t.Fatal("the memory holder did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	sn, err := live.c.SnapshotWith(ctx, src.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	state := sn.MemoryState
	live.kill()
	live = nil
	if live, err = startServe(t, data, args...); err != nil {
		t.Fatal(err)
	}
	got, err := live.c.GetSnapshot(ctx, sn.ID)
	layout := datadir.Layout{Root: data}
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		if _, err := os.Stat(filepath.Join(layout.MemorySnapshots(), sn.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a snapshot dropped unsealed left its sealed directory (%v)", err)
		}
		t.Logf("killed while %s: the snapshot was dropped at start-up", state)
	case err != nil:
		t.Fatal(err)
	case got.MemoryState != "sealed":
		t.Fatalf("after the restart the snapshot's memory_state is %q, want it sealed or gone", got.MemoryState)
	default:
		clone, _, err := live.c.CreateSession(ctx, client.CreateRequest{Snapshot: sn.ID}, "")
		if err != nil {
			t.Fatalf("restore of the sealed snapshot after the restart: %v", err)
		}
		execIn(t, live.c, clone.ID, "test -f /tmp/held")
		t.Logf("killed while %s: the seal had finished", state)
	}
	if left := scratchFor(t, data, sn.ID); len(left) > 0 {
		t.Fatalf("plaintext of the snapshot left after the restart: %v", left)
	}
	if des, _ := os.ReadDir(layout.CheckpointScratch()); len(des) > 0 {
		t.Fatalf("checkpoint scratch not emptied at start-up: %d entries", len(des))
	}
	execIn(t, live.c, src.ID, "test -f /tmp/held")
}
