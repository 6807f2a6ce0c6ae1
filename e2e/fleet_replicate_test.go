package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// startFleet3 starts hosts a, b and c (startFleet) sharing one snapshot
// key in their environment, as a fleet's hosts must, with
// --host-lost-after 4s and a 256 MB cache of pulled snapshots.
func startFleet3(t *testing.T) []*serveProc {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	t.Setenv("FORKBOX_SNAPSHOT_KEY", hex.EncodeToString(key))
	return startFleet(t, []string{"a", "b", "c"}, "--host-lost-after", "4s", "--snapshot-cache-mb", "256")
}

// forkWhenReplicated forks snapshot id once through host p, pinned to
// fleet host id host, asking again
// while p answers that it does not know it (its copy is still being made
// on its own host) or that the fleet is not available yet, for at most
// two minutes.
func forkWhenReplicated(t *testing.T, p *serveProc, host, id string) *client.Session {
	t.Helper()
	var last error
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		res, err := p.c.ForkSnapshot(ctxFor(t, 2*time.Minute), id, client.ForkRequest{Count: 1, CreateRequest: client.CreateRequest{Host: host}})
		if err == nil {
			if len(res.Sessions) != 1 {
				t.Fatalf("fork answered %d sessions", len(res.Sessions))
			}
			return &res.Sessions[0]
		}
		// 404 while b still copies it, 503 while a's view of the fleet
		// is still opening.
		if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("fork of %s: %v", id, err)
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("snapshot %s never forked: %v", id, last)
	return nil
}

// catNote reads the note the session on b wrote, in session id of p.
func catNote(t *testing.T, p *serveProc, id string) string {
	t.Helper()
	out, err := p.c.ExecCollect(ctxFor(t, time.Minute), id, client.ExecRequest{Cmd: "cat /home/user/note.txt"})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out.Stdout))
}

// TestFleetSnapshotForkOnAnotherHost proves a runc files snapshot taken
// on host b (after a file was written in its session) is copied to the
// fleet's object store in the background and forks on host a, asked
// through a's own API: the child is a's session and sees the file. Then
// b is killed (SIGKILL), a's imported copy is deleted (its cached copy
// with it), and the snapshot still forks on a, pulled again from the
// object store that outlived its host.
func TestFleetSnapshotForkOnAnotherHost(t *testing.T) {
	need(t)
	procs := startFleet3(t)
	a, b := procs[0], procs[1]
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
	if err := b.c.DeleteSession(ctxFor(t, time.Minute), src.ID); err != nil {
		t.Fatal(err)
	}

	child := forkWhenReplicated(t, a, "a", sn.ID)
	if got := catNote(t, a, child.ID); got != "written-on-b" {
		t.Fatalf("the child on a reads %q, want the file written on b", got)
	}
	mine, err := a.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range mine {
		found = found || s.ID == child.ID
	}
	if !found {
		t.Fatalf("the child %s is not one of a's sessions", child.ID)
	}
	if err := a.c.DeleteSession(ctxFor(t, time.Minute), child.ID); err != nil {
		t.Fatal(err)
	}

	b.kill()
	if err := a.c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true); err != nil {
		t.Fatal(err)
	}
	again := forkWhenReplicated(t, a, "a", sn.ID)
	if got := catNote(t, a, again.ID); got != "written-on-b" {
		t.Fatalf("after b died, the child on a reads %q", got)
	}
	if err := a.c.DeleteSession(ctxFor(t, time.Minute), again.ID); err != nil {
		t.Fatal(err)
	}
}

// TestFleetGVisorMemorySnapshotRestoresOnAnotherHost proves a gVisor
// memory snapshot taken on host b (a counter running in its session)
// forks on host a once copied: a pulls its files and its sealed memory
// checkpoint, verifies and imports them, and the child on a continues the
// counter from where the snapshot caught it.
func TestFleetGVisorMemorySnapshotRestoresOnAnotherHost(t *testing.T) {
	needGVisor(t)
	procs := startFleet3(t)
	a, b := procs[0], procs[1]
	src, _, err := b.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Isolation: "gvisor", Host: "b"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.ExecBackground(ctxFor(t, time.Minute), src.ID, client.ExecRequest{Cmd: counterLoop}); err != nil {
		t.Fatal(err)
	}
	counter := func(p *serveProc, id string) int {
		t.Helper()
		out, err := p.c.ExecCollect(ctxFor(t, time.Minute), id, client.ExecRequest{Cmd: "cat /tmp/count 2>/dev/null || echo 0"})
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(out.Stdout)))
		if err != nil {
			t.Fatalf("counter in %s: %q", id, out.Stdout)
		}
		return n
	}
	waitUntil(t, time.Minute, "the counter runs on b", func() bool { return counter(b, src.ID) > 10 })
	sn, err := b.c.SnapshotWith(ctxFor(t, 2*time.Minute), src.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	atSnapshot := counter(b, src.ID)
	if err := b.c.DeleteSession(ctxFor(t, time.Minute), src.ID); err != nil {
		t.Fatal(err)
	}
	child := forkWhenReplicated(t, a, "a", sn.ID)
	if child.Driver != "gvisor" {
		t.Fatalf("the child on a runs on %q, want gvisor", child.Driver)
	}
	first := counter(a, child.ID)
	if first < atSnapshot-40 || first == 0 {
		t.Fatalf("the child on a counts %d, the source had %d at the snapshot: it did not continue", first, atSnapshot)
	}
	waitUntil(t, time.Minute, "the child's counter goes on", func() bool { return counter(a, child.ID) > first })
	if err := a.c.DeleteSession(ctxFor(t, time.Minute), child.ID); err != nil {
		t.Fatal(err)
	}
}
