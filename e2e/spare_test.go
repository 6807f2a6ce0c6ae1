package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
)

// spareMode is how many spares the shared daemon keeps
// (FORKBOX_E2E_SPARES; the Makefile reruns the exec, files, snapshot,
// fork, isolation and disk tests with 4, so that their sessions come
// from spares); 0: none.
var spareMode, _ = strconv.Atoi(os.Getenv("FORKBOX_E2E_SPARES"))

// checkSparesUsed fails a spare-mode run in which no create took a spare.
func checkSparesUsed() error {
	req, _ := http.NewRequest("GET", env.d.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+env.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, `forkbox_session_create_seconds_count{path="spare"} `); ok && v != "0" {
			return nil
		}
	}
	return fmt.Errorf("no session of the run was made from a spare")
}

// spareDaemon starts a daemon of the test's own that keeps n spares, and
// waits until they are ready.
func spareDaemon(t *testing.T, n int) *ownDaemon {
	t.Helper()
	if st := os.Getenv("FORKBOX_STORAGE"); st != "" && st != "btrfs" {
		t.Skipf("spares need btrfs storage (its layers can be id-mapped), not %s; the btrfs pass runs this test", st)
	}
	o := newOwnDaemonWith(t, func(opts *daemon.Options) { opts.Spares = n })
	waitSpares(t, o, n)
	return o
}

// waitSpares waits until o has n spares ready.
func waitSpares(t *testing.T, o *ownDaemon, n int) {
	t.Helper()
	series := `forkbox_pool_ready{template="(spare)"}`
	waitForLong(t, 3*time.Minute, func() bool { return metricOf(t, o.d.URL, o.key, series) >= float64(n) })
}

// spareCreates is how many creates of o took a spare.
func spareCreates(t *testing.T, o *ownDaemon) float64 {
	return metricOf(t, o.d.URL, o.key, `forkbox_session_create_seconds_count{path="spare"}`)
}

// ownSh runs cmd with sh -c in session id of o and returns its stdout; a
// failure or a non-zero exit fails the test.
func ownSh(t *testing.T, o *ownDaemon, id, cmd string) string {
	t.Helper()
	return clientSh(t, o.c, id, cmd)
}

// clientSh is ownSh through client c.
func clientSh(t *testing.T, c *client.Client, id, cmd string) string {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := c.Exec(ctxFor(t, time.Minute), id, client.ExecRequest{Cmd: cmd}, &out, &errb)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s in %s: %+v %v: %s", cmd, id, res, err, errb.String())
	}
	return out.String()
}

// mountTable is a session's mount table as a sorted list of "mount
// point, fs type, mount options", without the per-sandbox ids that
// mount sources and super-block options carry.
func mountTable(t *testing.T, c *client.Client, id string) []string {
	t.Helper()
	var rows []string
	for _, line := range strings.Split(strings.TrimSpace(clientSh(t, c, id, "cat /proc/self/mountinfo")), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(f) {
			t.Fatalf("mountinfo line %q", line)
		}
		rows = append(rows, fmt.Sprintf("%s %s %s", f[4], f[sep+1], f[5]))
	}
	sort.Strings(rows)
	return rows
}

// TestSpareTakesSnapshotFiles proves that sessions made from spares (a
// create from a template, and the children of a fork) see exactly their
// template's or snapshot's files: the parent's write made just before
// the snapshot (while another file was still being written) is there,
// nothing of the spare's own life is, and two children never share a
// write. Each child is its own: its session id is its hostname, its
// machine id is its own, it has the mount table of a cold-started
// session, and its memory, pids and disk limits are the ones it asked
// for, enforced from the host. A spare is handed out once.
func TestSpareTakesSnapshotFiles(t *testing.T) {
	o := spareDaemon(t, 4)
	ctx := ctxFor(t, 5*time.Minute)
	before := spareCreates(t, o)
	parent, _, err := o.c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := spareCreates(t, o); got != before+1 {
		t.Fatalf("the create did not take a spare (%v spare creates, were %v)", got, before)
	}
	// A file being written (a background writer) and one written and
	// closed just before the snapshot.
	ownSh(t, o, parent.ID, `(i=0; while [ $i -lt 100000 ]; do echo line $i; i=$((i+1)); done > /home/user/growing) >/dev/null 2>&1 &
echo kept > /home/user/kept`)
	snap, err := o.c.Snapshot(ctx, parent.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitSpares(t, o, 4)
	before = spareCreates(t, o)
	fork, err := o.c.ForkSnapshot(ctx, snap.ID, client.ForkRequest{Count: 3,
		CreateRequest: client.CreateRequest{CPU: 0.5, MemoryMB: 256, Pids: 100, DiskMB: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if got := spareCreates(t, o); got != before+3 {
		t.Fatalf("%v of 3 fork children took a spare", got-before)
	}
	// A cold session of the same template (the shared daemon keeps no
	// spares), for its mount table.
	coldTable := mountTable(t, env.c, newSession(t, client.CreateRequest{}).ID)

	seen := map[string]bool{parent.ID: true}
	machineIDs := map[string]bool{}
	for i, c := range fork.Sessions {
		if seen[c.ID] {
			t.Fatalf("session id %s handed out twice", c.ID)
		}
		seen[c.ID] = true
		if got := ownSh(t, o, c.ID, "cat /home/user/kept"); got != "kept\n" {
			t.Fatalf("child %d: kept = %q", i, got)
		}
		// The growing file is there as far as the snapshot caught it: whole
		// lines (each line is one write, which a freeze does not cut).
		if got := ownSh(t, o, c.ID, `test -f /home/user/growing && tail -c 1 /home/user/growing | od -An -c | tr -d ' '`); got != "\\n\n" && got != "" {
			t.Fatalf("child %d: the file being written ends in %q, not a whole line", i, got)
		}
		if got := ownSh(t, o, c.ID, "hostname; cat /etc/hostname"); got != c.ID+"\n"+c.ID+"\n" {
			t.Fatalf("child %d: hostname %q, want %s", i, got, c.ID)
		}
		mid := ownSh(t, o, c.ID, "cat /etc/machine-id")
		if machineIDs[mid] {
			t.Fatalf("child %d shares machine id %q", i, mid)
		}
		machineIDs[mid] = true
		// Nothing but the snapshot's files: the root is the template's,
		// and the spare's empty root is gone.
		if got := ownSh(t, o, c.ID, "ls -a / | tr '\\n' ' '"); strings.Contains(got, "next") {
			t.Fatalf("child %d: / holds %q", i, got)
		}
		if out := ownSh(t, o, c.ID, "ls -A /.forkbox"); strings.TrimSpace(out) != "bin" {
			t.Fatalf("child %d: /.forkbox holds %q", i, out)
		}
		if got := mountTable(t, o.c, c.ID); strings.Join(got, "\n") != strings.Join(coldTable, "\n") {
			t.Fatalf("child %d's mount table differs from a cold session's:\n%s\n-- cold:\n%s", i, strings.Join(got, "\n"), strings.Join(coldTable, "\n"))
		}
		// Its limits, from the host's side.
		if v := readCgroupInt(t, "memory", c.ID, "memory.limit_in_bytes"); v != 256<<20 {
			t.Fatalf("child %d: memory limit %d, want 256 MiB", i, v)
		}
		if v := readCgroupInt(t, "cpu", c.ID, "cpu.cfs_quota_us"); v != 50000 {
			t.Fatalf("child %d: CPU quota %d µs per 100 ms, want 50000 (half a core)", i, v)
		}
		if v := readCgroupInt(t, "memory", c.ID, "memory.memsw.limit_in_bytes"); v != 256<<20 {
			t.Fatalf("child %d: memory+swap limit %d, want 256 MiB", i, v)
		}
		if v := readCgroupInt(t, "pids", c.ID, "pids.max"); v != 100 {
			t.Fatalf("child %d: pids.max %d, want 100", i, v)
		}
		// A write over its 64 MiB disk limit fails; the child goes on.
		var errb bytes.Buffer
		res, err := o.c.Exec(ctx, c.ID, client.ExecRequest{Cmd: "dd if=/dev/zero of=/home/user/big bs=1M count=100"}, nil, &errb)
		if err != nil || res.ExitCode == 0 {
			t.Fatalf("child %d: a 100 MiB write under a 64 MiB disk limit: %+v %v", i, res, err)
		}
		ownSh(t, o, c.ID, "rm -f /home/user/big")
	}
	// Two children never share a write.
	a, b := fork.Sessions[0].ID, fork.Sessions[1].ID
	ownSh(t, o, a, "echo only-a > /home/user/own; echo a >> /home/user/kept")
	if got := ownSh(t, o, b, "cat /home/user/kept; test -e /home/user/own && echo shared || echo alone"); got != "kept\nalone\n" {
		t.Fatalf("child b sees child a's writes: %q", got)
	}
	if got := ownSh(t, o, parent.ID, "cat /home/user/kept"); got != "kept\n" {
		t.Fatalf("the parent sees a child's write: %q", got)
	}
	// More creates than spares: every session is new.
	for i := 0; i < 6; i++ {
		s, _, err := o.c.CreateSession(ctx, client.CreateRequest{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if seen[s.ID] {
			t.Fatalf("session id %s handed out twice", s.ID)
		}
		seen[s.ID] = true
		if err := o.c.DeleteSession(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSpareSessionLifecycle: a refused create uses up no spare; a
// session made from a spare pauses and
// resumes, is snapshotted and forked again (a chain), keeps its template's
// environment and PATH and its own user and working directory, and is
// adopted by a restarted daemon like any session.
func TestSpareSessionLifecycle(t *testing.T) {
	o := spareDaemon(t, 2)
	ctx := ctxFor(t, 5*time.Minute)
	// A create of a template that does not exist is refused without
	// using up a spare.
	if _, _, err := o.c.CreateSession(ctx, client.CreateRequest{Template: "no-such-template"}, ""); err == nil {
		t.Fatal("a create of a missing template was not refused")
	}
	if n := metricOf(t, o.d.URL, o.key, `forkbox_pool_ready{template="(spare)"}`); n != 2 {
		t.Fatalf("%v spares ready after a refused create, want 2", n)
	}
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{User: "root", Workdir: "/tmp", Env: map[string]string{"FB_SPARE": "yes"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := spareCreates(t, o); got < 1 {
		t.Fatal("the create did not take a spare")
	}
	if got := ownSh(t, o, s.ID, `id -u; pwd; echo $FB_SPARE; echo $PATH`); !strings.HasPrefix(got, "0\n/tmp\nyes\n") || !strings.Contains(got, "/usr/bin") {
		t.Fatalf("user, workdir, env, PATH: %q", got)
	}
	if _, err := o.c.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := o.c.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	ownSh(t, o, s.ID, "echo gen1 > /root/gen")
	waitSpares(t, o, 2)
	fork, err := o.c.ForkSession(ctx, s.ID, client.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	child := fork.Sessions[0].ID
	ownSh(t, o, child, "echo gen2 >> /root/gen")
	fork2, err := o.c.ForkSession(ctx, child, client.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	grand := fork2.Sessions[0].ID
	if got := ownSh(t, o, grand, "cat /root/gen"); got != "gen1\ngen2\n" {
		t.Fatalf("the grandchild's file: %q", got)
	}
	o.restart(t, nil)
	for _, id := range []string{s.ID, child, grand} {
		if got := ownSh(t, o, id, "echo "+strconv.Quote("after restart")); got != "after restart\n" {
			t.Fatalf("%s after the restart: %q", id, got)
		}
	}
}

// TestSpareOnSharedMount: spares work when the data directory is on a
// shared mount (systemd makes / shared): the clones of the files' mounts
// are made private, else pivot_root refuses them (EINVAL) and every
// create would waste a spare and start cold. The session's mounts are no
// peers of the host's.
func TestSpareOnSharedMount(t *testing.T) {
	need(t)
	dir, err := os.MkdirTemp("", "forkbox-shared-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Unmount(dir, unix.MNT_DETACH)
		os.RemoveAll(dir)
	})
	t.Setenv("TMPDIR", dir) // (newOwnDaemon's data directory goes there)
	o := spareDaemon(t, 1)
	before := spareCreates(t, o)
	s, _, err := o.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := spareCreates(t, o); got != before+1 {
		t.Fatal("on a shared mount the create did not take a spare")
	}
	for _, line := range strings.Split(ownSh(t, o, s.ID, "cat /proc/self/mountinfo"), "\n") {
		if strings.Contains(line, "shared:") {
			t.Fatalf("a mount of the session is shared with the host: %s", line)
		}
	}
}
