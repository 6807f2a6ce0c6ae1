package e2e

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// readCounter reads the number the counter process last wrote, through
// the files API of a running session; -1 before the first write.
func readCounter(t *testing.T, id string) int {
	t.Helper()
	rc, err := env.c.Download(ctxFor(t, time.Minute), id, "/tmp/counter", "")
	if errors.Is(err, errdefs.ErrNotFound) {
		return -1
	}
	if err != nil {
		t.Fatalf("counter file: %v", err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("counter file holds %q", b)
	}
	return n
}

// TestPauseResume proves a paused sandbox's counter process stops
// advancing and uses no CPU, calls on it get 409 "paused", and on resume
// the same process (same pid, same open file) continues; three cycles lose
// no file change; the timeout clock stops while paused.
func TestPauseResume(t *testing.T) {
	s := newSession(t, client.CreateRequest{TimeoutS: 600})
	ctx := ctxFor(t, 2*time.Minute)
	counter := `import os, time
f = open("/tmp/counter.log", "a")
i = 0
while True:
    i += 1
    f.write("%d\n" % i); f.flush()
    with open("/tmp/counter.tmp", "w") as c: c.write(str(i))
    os.rename("/tmp/counter.tmp", "/tmp/counter")
    time.sleep(0.01)
`
	pid, err := env.c.ExecBackground(ctx, s.ID, client.ExecRequest{Argv: []string{"python3", "-c", counter}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return readCounter(t, s.ID) > 10 })
	for cycle := 0; cycle < 3; cycle++ {
		sh(t, s.ID, "echo "+strconv.Itoa(cycle)+" >> /tmp/cycles")
		p, err := env.c.Pause(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if p.State != "paused" || p.ExpiresAt != nil || p.RemainingS < 500 {
			t.Fatalf("paused session %+v", p)
		}
		u1, err := env.c.Usage(ctx, s.ID)
		if err != nil {
			t.Fatalf("usage of a paused session: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
		u2, _ := env.c.Usage(ctx, s.ID)
		if u2.CPUSeconds-u1.CPUSeconds > 0.005 {
			t.Fatalf("paused sandbox used %.4f CPU-s", u2.CPUSeconds-u1.CPUSeconds)
		}
		if _, err := env.c.Exec(ctx, s.ID, client.ExecRequest{Argv: []string{"true"}}, nil, nil); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "paused") {
			t.Fatalf("exec on a paused session: %v, want 409 paused", err)
		}
		if _, err := env.c.Pause(ctx, s.ID); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("second pause: %v", err)
		}
		r, err := env.c.Resume(ctx, s.ID)
		if err != nil || r.State != "running" || r.ExpiresAt == nil {
			t.Fatalf("resume: %+v %v", r, err)
		}
		before := readCounter(t, s.ID)
		waitFor(t, func() bool { return readCounter(t, s.ID) > before+5 })
	}
	ps, err := env.c.Processes(ctx, s.ID)
	if err != nil || !hasProcess(ps, pid, "") {
		t.Fatalf("the counter process (pid %d) did not survive: %+v %v", pid, ps, err)
	}
	// The same open file kept growing without a gap.
	log := strings.Fields(sh(t, s.ID, "cat /tmp/counter.log"))
	for i, v := range log {
		if v != strconv.Itoa(i+1) {
			t.Fatalf("counter log broke at line %d: %q", i+1, v)
		}
	}
	if got := sh(t, s.ID, "cat /tmp/cycles"); got != "0\n1\n2\n" {
		t.Fatalf("file changes across pauses: %q", got)
	}
	if _, err := env.c.Resume(ctx, s.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("resume of a running session: %v", err)
	}
}

// TestAutoPause proves a session created with auto_pause_s pauses itself
// after that long without calls, and its next exec resumes it.
func TestAutoPause(t *testing.T) {
	s := newSession(t, client.CreateRequest{AutoPauseS: 1})
	ctx := ctxFor(t, time.Minute)
	waitFor(t, func() bool {
		got, err := env.c.GetSession(ctx, s.ID)
		return err == nil && got.State == "paused"
	})
	if got := sh(t, s.ID, "echo awake"); got != "awake\n" {
		t.Fatalf("exec after auto-pause: %q", got)
	}
	if got, _ := env.c.GetSession(ctx, s.ID); got.State != "running" {
		t.Fatalf("after the exec the session is %s", got.State)
	}
	// A long exec keeps it awake past the idle period.
	res, _, _ := run(t, s.ID, client.ExecRequest{Cmd: "sleep 2.5; echo done"})
	if res.ExitCode != 0 {
		t.Fatalf("long exec in an auto-pause session: %+v", res)
	}
}

// TestAutoPauseSurvivesRestart proves a session that paused itself
// (auto_pause_s) still resumes on its next call after a daemon restart;
// the flag used to live only in memory, so after a restart the session
// answered 409 "paused" as if a user had paused it.
func TestAutoPauseSurvivesRestart(t *testing.T) {
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 2*time.Minute)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{AutoPauseS: 1}, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		got, err := o.c.GetSession(ctx, s.ID)
		return err == nil && got.State == "paused"
	})
	o.restart(t, nil)
	out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "echo awake"})
	if err != nil || string(out.Stdout) != "awake\n" {
		t.Fatalf("exec in an auto-paused session after a restart: %+v %v", out, err)
	}
	if got, err := o.c.GetSession(ctx, s.ID); err != nil || got.State != "running" {
		t.Fatalf("after the exec: %+v %v", got, err)
	}
}
