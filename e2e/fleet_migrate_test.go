package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestFleetMigrate proves POST /v1/sessions/{id}/migrate, asked through
// host a's API for a runc session on c with a file written: an unknown
// host is 404 and c itself 400, the source running on after each; a
// migration to a answers a new session on a that has the file, and the
// old id is gone; `forkbox host drain c --migrate` moves another session
// off c; a migration to a lost host (b, killed) is 503 and the session
// stays where it was, running.
func TestFleetMigrate(t *testing.T) {
	need(t)
	procs := startFleet3(t)
	a, b, c := procs[0], procs[1], procs[2]
	src, _, err := c.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Env: map[string]string{"MIGRATED_ENV": "kept"},
		MemoryMB: 384, Pids: 200, User: "root", Workdir: "/tmp"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.c.ExecCollect(ctxFor(t, time.Minute), src.ID, client.ExecRequest{Cmd: "echo written-on-c > /home/user/note.txt"}); err != nil {
		t.Fatal(err)
	}
	running := func(p *serveProc, id string) {
		t.Helper()
		s, err := p.c.GetSession(ctxFor(t, time.Minute), id)
		if err != nil || s.State != "running" {
			t.Fatalf("session %s after a failed migration: %v, state %v", id, err, s)
		}
		if got := catNote(t, p, id); got != "written-on-c" {
			t.Fatalf("session %s reads %q after a failed migration", id, got)
		}
	}

	if _, err := a.c.Migrate(ctxFor(t, time.Minute), src.ID, "nosuchhost"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("migrate to an unknown host: %v, want 404", err)
	}
	running(a, src.ID)
	if _, err := a.c.Migrate(ctxFor(t, time.Minute), src.ID, "c"); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "host") {
		t.Fatalf("migrate to its own host: %v, want 400 naming host", err)
	}
	running(a, src.ID)

	moved, err := a.c.Migrate(ctxFor(t, 5*time.Minute), src.ID, "a")
	if err != nil {
		t.Fatal(err)
	}
	if moved.ID == src.ID || moved.State != "running" {
		t.Fatalf("migrate answered %+v", moved)
	}
	// The session's settings move with it: limits, user, workdir, driver.
	if moved.MemoryMB != src.MemoryMB || moved.Pids != src.Pids || moved.CPU != src.CPU ||
		moved.User != "root" || moved.Workdir != "/tmp" || moved.Driver != src.Driver {
		t.Errorf("settings after migrate: memory %d pids %d cpu %v user %q workdir %q driver %q; before: %d %d %v %q %q %q",
			moved.MemoryMB, moved.Pids, moved.CPU, moved.User, moved.Workdir, moved.Driver,
			src.MemoryMB, src.Pids, src.CPU, src.User, src.Workdir, src.Driver)
	}
	if got := catNote(t, a, moved.ID); got != "written-on-c" {
		t.Fatalf("the migrated session reads %q, want the file written on c", got)
	}
	out, err := a.c.ExecCollect(ctxFor(t, time.Minute), moved.ID, client.ExecRequest{Cmd: "echo $MIGRATED_ENV"})
	if err != nil || strings.TrimSpace(string(out.Stdout)) != "kept" {
		t.Fatalf("the migrated session's env: %v %+v", err, out)
	}
	keyB, err := os.ReadFile(filepath.Join(a.dataDir, "api-key"))
	if err != nil {
		t.Fatal(err)
	}
	if hs := hostsOf(t, a, strings.TrimSpace(string(keyB))); hs[moved.ID] != "a" {
		t.Fatalf("the migrated session is on %q, want a (%v)", hs[moved.ID], hs)
	}
	if s, err := a.c.GetSession(ctxFor(t, time.Minute), src.ID); err == nil && s.State != "terminated" {
		t.Fatalf("the old id %s still answers %s", src.ID, s.State)
	} else if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the old id: %v", err)
	}

	// A drain with --migrate moves c's other session off it.
	other, _, err := c.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if hs := hostsOf(t, a, strings.TrimSpace(string(keyB))); hs[other.ID] != "c" {
		// Placed elsewhere (the least loaded host): move it to c first.
		if other, err = a.c.Migrate(ctxFor(t, 5*time.Minute), other.ID, "c"); err != nil {
			t.Fatal(err)
		}
	}
	cli := exec.Command(env.cli, "host", "drain", "c", "--migrate")
	cli.Env = append(os.Environ(), "FORKBOX_URL="+a.c.BaseURL(), "FORKBOX_API_KEY="+strings.TrimSpace(string(keyB)))
	drained, err := cli.CombinedOutput()
	if err != nil || !strings.Contains(string(drained), other.ID+" migrated: now ") {
		t.Fatalf("forkbox host drain c --migrate: %v: %s (the fleet lists %v)", err, drained, hostsOf(t, a, strings.TrimSpace(string(keyB))))
	}
	newID := strings.TrimSpace(strings.SplitN(string(drained), other.ID+" migrated: now ", 2)[1])
	if hs := hostsOf(t, a, strings.TrimSpace(string(keyB))); hs[newID] == "" || hs[newID] == "c" {
		t.Fatalf("after the drain the migrated session %s is on %q", newID, hs[newID])
	}
	if err := a.c.DeleteSession(ctxFor(t, time.Minute), newID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.UndrainHost(ctxFor(t, time.Minute), "c"); err != nil {
		t.Fatal(err)
	}

	b.kill()
	waitUntil(t, time.Minute, "a lists b lost", func() bool {
		l, err := a.c.Hosts(ctxFor(t, 10*time.Second))
		if err != nil {
			return false
		}
		for _, h := range l.Hosts {
			if h.ID == "b" {
				return h.State == "lost"
			}
		}
		return false
	})
	if _, err := c.c.Migrate(ctxFor(t, time.Minute), moved.ID, "b"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("migrate to a lost host: %v, want 503", err)
	}
	running(a, moved.ID)
	if err := a.c.DeleteSession(ctxFor(t, time.Minute), moved.ID); err != nil {
		t.Fatal(err)
	}
}

// TestFleetMigrateGVisor proves a gVisor session migrates with its
// processes and memory: a counter running in it on c goes on counting in
// the new session on the other host the fleet picks, from about where it
// was.
func TestFleetMigrateGVisor(t *testing.T) {
	needGVisor(t)
	procs := startFleet3(t)
	a, c := procs[0], procs[2]
	src, _, err := c.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Isolation: "gvisor"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.c.ExecBackground(ctxFor(t, time.Minute), src.ID, client.ExecRequest{Cmd: counterLoop}); err != nil {
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
	waitUntil(t, time.Minute, "the counter runs on c", func() bool { return counter(c, src.ID) > 10 })
	before := counter(c, src.ID)
	moved, err := a.c.Migrate(ctxFor(t, 5*time.Minute), src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if moved.Driver != "gvisor" || moved.ID == src.ID {
		t.Fatalf("migrate answered %+v", moved)
	}
	first := counter(a, moved.ID)
	if first < before {
		t.Fatalf("the migrated counter is at %d, it was at %d before: it did not continue", first, before)
	}
	waitUntil(t, time.Minute, "the migrated counter goes on", func() bool { return counter(a, moved.ID) > first })
	if err := a.c.DeleteSession(ctxFor(t, time.Minute), moved.ID); err != nil {
		t.Fatal(err)
	}
}
