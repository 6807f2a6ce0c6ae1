package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
)

// needGVisor skips t when runsc is not installed, except under CI=1, where
// it must be (the install script adds it from bookworm-backports).
func needGVisor(t *testing.T) {
	t.Helper()
	need(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("runsc is not installed; CI must run the gVisor tests (make deps installs it)")
		}
		t.Skip("runsc is not installed (Debian bookworm-backports; make deps installs it)")
	}
}

// legacyRunsc reports whether the daemon's gVisor driver runs the 2024
// runsc of Debian's package (version "0.0~DATE..."), whose checkpoints
// refuse deleted open files and whose procfs shows every environment;
// the pinned build from gVisor's Go branch does neither.
func legacyRunsc(t *testing.T) bool {
	t.Helper()
	in, err := env.c.Info(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range in.Drivers {
		if d.Name == "gvisor" {
			if d.Version == "" {
				t.Fatal("GET /v1/info names no runsc version for the gvisor driver")
			}
			return strings.HasPrefix(d.Version, "0.0~")
		}
	}
	t.Fatal("the daemon has no gvisor driver")
	return false
}

// gvisorSession starts a gVisor session that is destroyed when t ends.
func gvisorSession(t *testing.T) *client.Session {
	t.Helper()
	needGVisor(t)
	return newSession(t, client.CreateRequest{Isolation: "gvisor"})
}

// background starts cmd in session id as a background process.
func background(t *testing.T, id, cmd string) {
	t.Helper()
	if _, err := env.c.ExecBackground(ctxFor(t, time.Minute), id, client.ExecRequest{Cmd: cmd}); err != nil {
		t.Fatalf("background %q: %v", cmd, err)
	}
}

// counterLoop counts in /tmp/count every 50 ms and writes /tmp/backwards
// if the monotonic clock ever goes back.
const counterLoop = `python3 -c '
import time, os
i, last = 0, time.monotonic()
while True:
    i += 1
    now = time.monotonic()
    if now < last:
        open("/tmp/backwards", "w").write("%f < %f" % (now, last))
    last = now
    with open("/tmp/count.tmp", "w") as f:
        f.write(str(i))
    os.rename("/tmp/count.tmp", "/tmp/count")
    time.sleep(0.05)
'`

// count reads the counter written by counterLoop.
func count(t *testing.T, id string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(sh(t, id, "cat /tmp/count")))
	if err != nil {
		t.Fatalf("counter in %s: %v", id, err)
	}
	return n
}

// memorySnapshot takes a memory snapshot of session id.
func memorySnapshot(t *testing.T, id string) *client.Snapshot {
	t.Helper()
	sn, err := env.c.SnapshotWith(ctxFor(t, 2*time.Minute), id, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatalf("memory snapshot of %s: %v", id, err)
	}
	if !sn.Memory || sn.MemoryDriver != "gvisor" || sn.MemoryBytes <= 0 {
		t.Fatalf("snapshot %+v is not a memory snapshot", sn)
	}
	t.Cleanup(func() { _ = env.c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true) })
	return sn
}

// TestGVisorMemoryForkContinuesProcesses: a counter loop, an HTTP server
// and a sleeping process started before a memory snapshot all carry on in
// every fork of it (and in the source), and each fork is its own machine:
// hostname, machine id, kernel randomness, wall clock.
func TestGVisorMemoryForkContinuesProcesses(t *testing.T) {
	src := gvisorSession(t)
	background(t, src.ID, counterLoop)
	background(t, src.ID, "cd /tmp && exec python3 -m http.server 8000")
	background(t, src.ID, `python3 -c 'import time; time.sleep(3); open("/tmp/woke", "w").write("yes"); time.sleep(100000)'`)
	waitFor(t, func() bool {
		res, _, _ := run(t, src.ID, client.ExecRequest{Cmd: "test -s /tmp/count && python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8000/\")'"})
		return res.ExitCode == 0
	})
	time.Sleep(500 * time.Millisecond)
	srcMachine := sh(t, src.ID, "cat /etc/machine-id")
	sn := memorySnapshot(t, src.ID)
	atSnapshot := count(t, src.ID) // a little past the snapshot: an upper bound for it

	forks := forkAll(t, sn.ID, 3)
	seen := map[string]string{"machine-id " + srcMachine: src.ID}
	for _, f := range forks {
		if f.Snapshot != sn.ID || f.Driver != "gvisor" {
			t.Fatalf("fork %+v", f)
		}
		// The counter continues from the snapshot's value; a restart from
		// scratch would be far below it.
		first := count(t, f.ID)
		if first < atSnapshot-20 || atSnapshot < 5 {
			t.Fatalf("fork %s counter %d, source had %d: it did not continue", f.ID, first, atSnapshot)
		}
		waitFor(t, func() bool { return count(t, f.ID) > first })
		out := sh(t, f.ID, `python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8000/").status)'; ps -eo stat=,args= | grep "[h]ttp.server"`)
		if !strings.HasPrefix(out, "200\n") || strings.Contains(out, "Z") {
			t.Fatalf("fork %s: HTTP server after restore: %q", f.ID, out)
		}
		waitFor(t, func() bool {
			res, _, _ := run(t, f.ID, client.ExecRequest{Cmd: "test -f /tmp/woke"})
			return res.ExitCode == 0
		})
		before := float64(time.Now().UnixNano()) / 1e9
		guest, err := strconv.ParseFloat(strings.TrimSpace(sh(t, f.ID, "python3 -c 'import time; print(time.time())'")), 64)
		after := float64(time.Now().UnixNano()) / 1e9
		if err != nil || guest < before-1 || guest > after+1 {
			t.Fatalf("fork %s wall clock %f, host %f..%f (%v)", f.ID, guest, before, after, err)
		}
		if got := strings.TrimSpace(sh(t, f.ID, "hostname")); got != f.ID {
			t.Fatalf("fork %s has hostname %q", f.ID, got)
		}
		for _, probe := range []string{
			"machine-id " + strings.TrimSpace(sh(t, f.ID, "cat /etc/machine-id")),
			"urandom " + sh(t, f.ID, "head -c 16 /dev/urandom | od -An -tx1"),
			"random " + sh(t, f.ID, "python3 -c 'import random; print(random.random())'"),
		} {
			if other, dup := seen[probe]; dup {
				t.Fatalf("fork %s shares %q with %s", f.ID, probe, other)
			}
			seen[probe] = f.ID
		}
		if out := sh(t, f.ID, "cat /tmp/backwards 2>/dev/null || true"); out != "" {
			t.Fatalf("fork %s: monotonic clock went backwards: %s", f.ID, out)
		}
	}
	// Forks diverge: a file written in one is not in the others.
	sh(t, forks[0].ID, "echo mine > /tmp/only0")
	if out := sh(t, forks[1].ID, "ls /tmp/only0 2>/dev/null || true"); out != "" {
		t.Fatalf("a fork sees another fork's file")
	}
	// The source kept running through the snapshot.
	c := count(t, src.ID)
	waitFor(t, func() bool { return count(t, src.ID) > c })
}

// TestGVisorTenSnapshotRestoreCycles: snapshot, restore into a new
// session, destroy the old one, ten times; the ticking process keeps
// ticking and the counter never starts again from zero.
func TestGVisorTenSnapshotRestoreCycles(t *testing.T) {
	s := gvisorSession(t)
	background(t, s.ID, counterLoop)
	waitFor(t, func() bool {
		res, _, _ := run(t, s.ID, client.ExecRequest{Cmd: "test -s /tmp/count"})
		return res.ExitCode == 0
	})
	id, last := s.ID, 0
	for i := 0; i < 10; i++ {
		sn := memorySnapshot(t, id)
		next, _, err := env.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{Snapshot: sn.ID}, "")
		if err != nil {
			t.Fatalf("cycle %d: restore: %v", i, err)
		}
		nid := next.ID
		t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), nid) })
		if err := env.c.DeleteSession(ctxFor(t, time.Minute), id); err != nil {
			t.Fatal(err)
		}
		id = nid
		n := count(t, id)
		if n < last {
			t.Fatalf("cycle %d: counter %d went back from %d", i, n, last)
		}
		waitFor(t, func() bool { return count(t, id) > n })
		last = n
	}
	if out := sh(t, id, "cat /tmp/backwards 2>/dev/null || true"); out != "" {
		t.Fatalf("monotonic clock went backwards: %s", out)
	}
}

// TestGVisorDeletedFileFailsCleanly: the 2024 runsc cannot save a file
// that was deleted while open; the memory snapshot fails with a clear
// error, leaves no snapshot or checkpoint behind, and the session carries
// on. A newer runsc saves such a file's data in the checkpoint: there the
// snapshot succeeds and a session restored from it still holds the file
// open where it was.
func TestGVisorDeletedFileFailsCleanly(t *testing.T) {
	s := gvisorSession(t)
	background(t, s.ID, `python3 -c '
import os, time
f = open("/home/user/gone", "w"); f.write("x"); f.flush(); os.unlink("/home/user/gone")
open("/tmp/held", "w").write("1")
time.sleep(100000)'`)
	waitFor(t, func() bool {
		res, _, _ := run(t, s.ID, client.ExecRequest{Cmd: "test -f /tmp/held"})
		return res.ExitCode == 0
	})
	before, _ := env.c.Snapshots(ctxFor(t, time.Minute))
	sn, err := env.c.SnapshotWith(ctxFor(t, 2*time.Minute), s.ID, client.SnapshotRequest{Memory: true})
	if !legacyRunsc(t) {
		if err != nil {
			t.Fatalf("memory snapshot with a deleted open file: %v", err)
		}
		t.Cleanup(func() { _ = env.c.DeleteSnapshot(context.Background(), sn.ID, false) })
		clone := newSession(t, client.CreateRequest{Snapshot: sn.ID})
		// gVisor's procfs cannot reopen a deleted file (and this one is
		// write-only): the descriptor and its offset show it was restored.
		got := sh(t, clone.ID, `p=$(pgrep -x python3); for f in /proc/$p/fd/*; do `+
			`case "$(readlink $f)" in *"/home/user/gone (deleted)") grep ^pos: /proc/$p/fdinfo/${f##*/};; esac; done`)
		if got != "pos:\t1\n" {
			t.Fatalf("restored session's deleted open file: %q, want it open at offset 1", got)
		}
		return
	}
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("memory snapshot with a deleted open file: %v, want a conflict naming it", err)
	}
	after, _ := env.c.Snapshots(ctxFor(t, time.Minute))
	if len(after) != len(before) {
		t.Fatalf("a failed memory snapshot left a snapshot: %d before, %d after", len(before), len(after))
	}
	if left, _ := os.ReadDir(datadir.Layout{Root: env.dataDir}.Scratch()); len(left) > 0 {
		t.Fatalf("checkpoint files left: %v", left)
	}
	if got := sh(t, s.ID, "echo alive; ps -eo comm= | grep -c '^python3$'"); got != "alive\n1\n" {
		t.Fatalf("session after the failed snapshot: %q", got)
	}
}

// TestGVisorMemorySnapshotSealed: the checkpoint is encrypted at rest (a
// marker held in a process's memory is not in its files), a flipped byte
// or a truncated file is refused before anything starts, and no decrypted
// image is left after restores.
func TestGVisorMemorySnapshotSealed(t *testing.T) {
	s := gvisorSession(t)
	marker := "forkbox-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	background(t, s.ID, fmt.Sprintf(`python3 -c '
import time
held = ["%s" * 64 for _ in range(1000)]
open("/tmp/ready", "w").write("1")
time.sleep(100000)'`, marker))
	waitFor(t, func() bool {
		res, _, _ := run(t, s.ID, client.ExecRequest{Cmd: "test -f /tmp/ready"})
		return res.ExitCode == 0
	})
	sn := memorySnapshot(t, s.ID)
	// Sealed after the answer (the test looks at the sealed files).
	waitSealed(t, env.c, sn.ID)
	dir := filepath.Join(env.dataDir, "memory", sn.ID)
	files, err := os.ReadDir(dir)
	if err != nil || len(files) < 2 {
		t.Fatalf("sealed checkpoint %s: %v %v", dir, files, err)
	}
	var biggest string
	var size int64
	for _, f := range files {
		b, _ := os.ReadFile(filepath.Join(dir, f.Name()))
		if bytes.Contains(b, []byte(marker)) {
			t.Fatalf("%s holds process memory in the clear", f.Name())
		}
		if int64(len(b)) > size && f.Name() != "manifest.json" {
			biggest, size = filepath.Join(dir, f.Name()), int64(len(b))
		}
	}
	// An untouched snapshot restores (and the marker is back in memory).
	ok, _, err := env.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{Snapshot: sn.ID}, "")
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	_ = env.c.DeleteSession(ctxFor(t, time.Minute), ok.ID)
	if left, _ := os.ReadDir(datadir.Layout{Root: env.dataDir}.Scratch()); len(left) > 0 {
		t.Fatalf("decrypted images left after a restore: %v", left)
	}
	orig, _ := os.ReadFile(biggest)
	damaged := map[string][]byte{"flipped byte": append([]byte(nil), orig...), "truncated": orig[:len(orig)/2]}
	damaged["flipped byte"][len(orig)/2] ^= 0x40
	for name, data := range damaged {
		if err := os.WriteFile(biggest, data, 0o600); err != nil {
			t.Fatal(err)
		}
		before, _ := env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{})
		_, _, err := env.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{Snapshot: sn.ID}, "")
		if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "integrity") {
			t.Fatalf("%s: restore gave %v, want an integrity failure", name, err)
		}
		if _, err := env.c.ForkSnapshot(ctxFor(t, time.Minute), sn.ID, client.ForkRequest{Count: 2}); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("%s: fork gave %v", name, err)
		}
		after, _ := env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{})
		if len(after) != len(before) {
			t.Fatalf("%s: a refused restore left sessions", name)
		}
	}
	if err := os.WriteFile(biggest, orig, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestGVisorIsolationChoice: /v1/info lists the gVisor driver and its
// capabilities; bad choices are 400s naming the field; a gVisor sandbox
// pauses and resumes; root in it has no CAP_SYS_ADMIN (the agent keeps it
// for itself).
func TestGVisorIsolationChoice(t *testing.T) {
	needGVisor(t)
	info, err := env.c.Info(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var caps map[string]bool
	for _, d := range info.Drivers {
		if d.Name == "gvisor" {
			caps = d.Capabilities
		}
	}
	if !caps["memory_snapshot"] || !caps["fork"] || !caps["pause"] {
		t.Fatalf("info does not list gvisor with memory snapshots: %+v", info.Drivers)
	}
	bad := []struct {
		req   client.CreateRequest
		field string
	}{
		{client.CreateRequest{Isolation: "kvm"}, "isolation"},
	}
	for _, b := range bad {
		_, _, err := env.c.CreateSession(ctxFor(t, time.Minute), b.req, "")
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != 400 || ce.Field != b.field {
			t.Fatalf("create %+v: %v, want a 400 naming %s", b.req, err, b.field)
		}
	}
	runcSession := newSession(t, client.CreateRequest{})
	_, err = env.c.SnapshotWith(ctxFor(t, time.Minute), runcSession.ID, client.SnapshotRequest{Memory: true})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 400 || ce.Field != "memory" {
		t.Fatalf("memory snapshot of a runc session: %v, want a 400 naming memory", err)
	}

	s := gvisorSession(t)
	if s.Driver != "gvisor" {
		t.Fatalf("session driver %q", s.Driver)
	}
	if out := sh(t, s.ID, "uname -r; id -u"); !strings.HasSuffix(out, "\n1000\n") {
		t.Fatalf("gVisor session: %q", out)
	}
	res, out, _ := run(t, s.ID, client.ExecRequest{User: "root",
		Cmd: "grep CapBnd /proc/self/status; hostname evil 2>&1; hostname"})
	if res.ExitCode != 0 || !strings.HasSuffix(out, s.ID+"\n") {
		t.Fatalf("root changed the hostname: %q", out)
	}
	var bnd uint64
	fmt.Sscanf(strings.Fields(out)[1], "%x", &bnd)
	if bnd&(1<<21) != 0 || bnd&(1<<8) != 0 {
		t.Fatalf("root in a gVisor sandbox has CAP_SYS_ADMIN or CAP_SETPCAP in its bounding set: %q", out)
	}
	if _, err := env.c.Pause(ctxFor(t, time.Minute), s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := env.c.Resume(ctxFor(t, time.Minute), s.ID); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, s.ID, "echo back"); got != "back\n" {
		t.Fatalf("after resume: %q", got)
	}
}
