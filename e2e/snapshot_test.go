package e2e

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// forkAll starts n sessions from snapshot snapID and destroys them when
// the test ends.
func forkAll(t *testing.T, snapID string, n int) []client.Session {
	t.Helper()
	res, err := env.c.ForkSnapshot(ctxFor(t, 2*time.Minute), snapID, client.ForkRequest{Count: n})
	if err != nil {
		t.Fatalf("fork %s x%d: %v", snapID, n, err)
	}
	if len(res.Sessions) != n || res.Snapshot.ID != snapID {
		t.Fatalf("fork result %+v", res)
	}
	for _, s := range res.Sessions {
		id := s.ID
		t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), id) })
	}
	return res.Sessions
}

// TestSnapshotForksDiverge proves a file written before a snapshot is in
// every fork, forks diverge independently (a write in one is invisible in
// the others and in the parent), and destroying the parent does not break
// them.
func TestSnapshotForksDiverge(t *testing.T) {
	parent := newSession(t, client.CreateRequest{})
	sh(t, parent.ID, "echo prepared > state.txt; mkdir -p deps && echo lib > deps/lib.txt")
	sn, err := env.c.Snapshot(ctxFor(t, time.Minute), parent.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if sn.Parent != "" || sn.SessionID != parent.ID || !strings.HasPrefix(sn.Digest, "sha256:") || sn.SizeBytes <= 0 {
		t.Fatalf("snapshot %+v", sn)
	}
	forks := forkAll(t, sn.ID, 3)
	for i, f := range forks {
		if f.Snapshot != sn.ID {
			t.Fatalf("fork %s does not name its snapshot: %+v", f.ID, f)
		}
		if got := sh(t, f.ID, "cat state.txt deps/lib.txt"); got != "prepared\nlib\n" {
			t.Fatalf("fork %d sees %q", i, got)
		}
		sh(t, f.ID, fmt.Sprintf("echo fork-%d > state.txt; echo mine > only-%d.txt", i, i))
	}
	sh(t, parent.ID, "echo parent-after > state.txt")
	for i, f := range forks {
		if got := sh(t, f.ID, "cat state.txt; ls only-*.txt"); got != fmt.Sprintf("fork-%d\nonly-%d.txt\n", i, i) {
			t.Errorf("fork %d did not diverge independently: %q", i, got)
		}
	}
	if got := sh(t, parent.ID, "cat state.txt; ls only-*.txt 2>/dev/null || true"); got != "parent-after\n" {
		t.Errorf("parent sees fork writes: %q", got)
	}
	if err := env.c.DeleteSession(ctxFor(t, time.Minute), parent.ID); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, forks[0].ID, "cat deps/lib.txt"); got != "lib\n" {
		t.Fatalf("fork broke when its parent was destroyed: %q", got)
	}
}

// TestSnapshotChainOfRestores proves 20 generations of restore → write →
// snapshot work through the API, each snapshot names its parent and stores
// only its own delta.
func TestSnapshotChainOfRestores(t *testing.T) {
	need(t)
	const depth, chunk = 20, 512 << 10
	req := client.CreateRequest{}
	parent := ""
	for i := 0; i < depth; i++ {
		s := newSession(t, req)
		sh(t, s.ID, fmt.Sprintf("head -c %d /dev/urandom > gen-%02d", chunk, i))
		sn, err := env.c.Snapshot(ctxFor(t, time.Minute), s.ID, 0)
		if err != nil {
			t.Fatalf("generation %d: %v", i, err)
		}
		if sn.Parent != parent {
			t.Fatalf("generation %d: parent %q, want %q", i, sn.Parent, parent)
		}
		if sn.SizeBytes < chunk || sn.SizeBytes > 3*chunk {
			t.Fatalf("generation %d snapshot stores %d bytes; its delta is %d", i, sn.SizeBytes, chunk)
		}
		_ = env.c.DeleteSession(ctxFor(t, time.Minute), s.ID)
		parent = sn.ID
		req = client.CreateRequest{Snapshot: sn.ID}
	}
	last := newSession(t, req)
	if got := strings.Fields(sh(t, last.ID, "ls gen-* | wc -l"))[0]; got != strconv.Itoa(depth) {
		t.Fatalf("the last restore has %s generations of files, want %d", got, depth)
	}
	// The chain cannot lose a link while a restore depends on it.
	if err := env.c.DeleteSnapshot(ctxFor(t, time.Minute), parent, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("deleting a snapshot a session uses: %v, want conflict", err)
	}
}

// TestSnapshotOfBusyWriterHasWholeFiles proves a snapshot taken while the
// sandbox rewrites files in a loop (write to a temporary file, rename)
// contains only whole files: each carries its own checksum and all verify.
func TestSnapshotOfBusyWriterHasWholeFiles(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	writer := `import hashlib, os, random
os.makedirs("data", exist_ok=True)
i = 0
while True:
    body = os.urandom(random.randint(1, 256 * 1024))
    name = "data/f%d" % (i % 16)
    with open(name + ".tmp", "wb") as f:
        f.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    os.rename(name + ".tmp", name)
    i += 1
`
	if _, err := env.c.ExecBackground(ctxFor(t, time.Minute), s.ID, client.ExecRequest{Argv: []string{"python3", "-c", writer}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.TrimSpace(sh(t, s.ID, "ls data | grep -vc tmp || true")) == "16" })
	var snaps []string
	for i := 0; i < 5; i++ {
		sn, err := env.c.Snapshot(ctxFor(t, time.Minute), s.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, sn.ID)
	}
	check := `import hashlib, glob
bad = 0
for p in glob.glob("data/f*"):
    if p.endswith(".tmp"):
        continue
    raw = open(p, "rb").read()
    want, _, body = raw.partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != want:
        bad += 1
print(bad)
`
	for _, id := range snaps {
		f := forkAll(t, id, 1)[0]
		if got := strings.TrimSpace(sh(t, f.ID, "python3 -c '"+check+"'")); got != "0" {
			t.Fatalf("snapshot %s has %s torn files", id, got)
		}
		_ = env.c.DeleteSession(ctxFor(t, time.Minute), f.ID)
	}
	if got := sh(t, s.ID, "echo still-running"); got != "still-running\n" {
		t.Fatal("the source stopped running after its snapshots")
	}
}

// TestSnapshotDeleteRules proves a snapshot in use cannot be deleted
// (409), force destroys its users and children first, and deleting it
// leaves it gone from the list.
func TestSnapshotDeleteRules(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	sh(t, s.ID, "echo v1 > v")
	sn, err := env.c.Snapshot(ctxFor(t, time.Minute), s.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	child := forkAll(t, sn.ID, 1)[0]
	grand, err := env.c.Snapshot(ctxFor(t, time.Minute), child.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if grand.Parent != sn.ID {
		t.Fatalf("child snapshot's parent %q, want %q", grand.Parent, sn.ID)
	}
	ctx := ctxFor(t, time.Minute)
	if err := env.c.DeleteSnapshot(ctx, sn.ID, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete of a used snapshot: %v, want conflict", err)
	}
	if err := env.c.DeleteSnapshot(ctx, sn.ID, true); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
	if got, _ := env.c.GetSession(ctx, child.ID); got.State != "terminated" {
		t.Fatalf("a session on a force-deleted snapshot is %s", got.State)
	}
	for _, id := range []string{sn.ID, grand.ID} {
		if _, err := env.c.GetSnapshot(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("snapshot %s after forced delete: %v", id, err)
		}
	}
	if _, err := env.c.ForkSnapshot(ctx, sn.ID, client.ForkRequest{Count: 1}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("fork of a deleted snapshot: %v", err)
	}
	if _, err := env.c.ForkSnapshot(ctx, "nosuchsnapshot", client.ForkRequest{Count: 0}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("fork count 0: %v", err)
	}
	// Snapshots with an expiry are collected by the janitor; this one is
	// only checked for its recorded expiry (the janitor runs every 30 s).
	exp, err := env.c.Snapshot(ctx, s.ID, 3600)
	if err != nil || exp.ExpiresAt == nil || time.Until(*exp.ExpiresAt) < 59*time.Minute {
		t.Fatalf("snapshot with expiry: %+v %v", exp, err)
	}
	_ = env.c.DeleteSnapshot(ctx, exp.ID, true)
	// An expiry too long for nanoseconds used to wrap around: 18446744074 s
	// (584 years) became 0.29 s and the janitor deleted the snapshot.
	if _, err := env.c.Snapshot(ctx, s.ID, 18446744074); !isFieldError(err, "expires_in_s") {
		t.Fatalf("snapshot with a 584-year expiry: %v, want 400 naming expires_in_s", err)
	}
}

// isFieldError reports whether err is a 400 naming field.
func isFieldError(err error, field string) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Field == field && errors.Is(err, errdefs.ErrInvalidArgument)
}

// TestSessionFork proves POST /v1/sessions/{id}/fork snapshots and starts
// copies in one call, inheriting the source's settings.
func TestSessionFork(t *testing.T) {
	s := newSession(t, client.CreateRequest{MemoryMB: 256, Env: map[string]string{"ROLE": "worker"}, Metadata: map[string]string{"job": "fork"}})
	sh(t, s.ID, "echo shared > shared.txt")
	res, err := env.c.ForkSession(ctxFor(t, 2*time.Minute), s.ID, client.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Sessions {
		id := f.ID
		t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), id) })
		if f.MemoryMB != 256 || f.Metadata["job"] != "fork" || f.Snapshot != res.Snapshot.ID {
			t.Errorf("fork did not inherit: %+v", f)
		}
		if got := sh(t, f.ID, "cat shared.txt; echo $ROLE"); got != "shared\nworker\n" {
			t.Errorf("fork sees %q", got)
		}
	}
}
