package e2e

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// waitProcess waits until session id runs a command whose command line
// contains marker, and returns its pid.
func waitProcess(t *testing.T, id, marker string) int {
	t.Helper()
	pid := 0
	waitFor(t, func() bool {
		ps, err := env.c.Processes(ctxFor(t, time.Minute), id)
		for _, p := range ps {
			if err == nil && strings.Contains(p.Cmd+" "+strings.Join(p.Args, " "), marker) {
				pid = p.Pid
				return true
			}
		}
		return false
	})
	return pid
}

// TestExecTimeoutWhilePaused proves, in both tiers, that a command whose
// exec timeout fires while its session is paused ends as timed out (exit
// 137, SIGKILL) rather than with an error: in the runc tier the kill is
// sent to frozen processes (they die when they run again) and the agent,
// frozen too, reports no end; the exec used to end with "503 agent:
// context deadline exceeded". After the resume the command is gone and
// the session runs commands.
func TestExecTimeoutWhilePaused(t *testing.T) {
	for _, iso := range []string{"runc", "gvisor"} {
		t.Run(iso, func(t *testing.T) {
			if iso == "gvisor" {
				needGVisor(t)
			}
			s := newSession(t, client.CreateRequest{Isolation: iso})
			type outcome struct {
				res *client.ExecResult
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := env.c.Exec(ctxFor(t, 2*time.Minute), s.ID, client.ExecRequest{Cmd: "sleep 600 # paused-timeout", TimeoutS: 3}, nil, nil)
				done <- outcome{res, err}
			}()
			waitProcess(t, s.ID, "paused-timeout")
			if _, err := env.c.Pause(ctxFor(t, time.Minute), s.ID); err != nil {
				t.Fatal(err)
			}
			var o outcome
			select {
			case o = <-done:
			case <-time.After(time.Minute): // a hang guard
				t.Fatal("the exec did not end after its timeout")
			}
			if o.err != nil || o.res == nil || !o.res.TimedOut || o.res.Signal != 9 || o.res.ExitCode != 137 {
				t.Fatalf("exec whose timeout fired while paused: %+v %v; want timed_out, signal 9, exit 137", o.res, o.err)
			}
			if _, err := env.c.Resume(ctxFor(t, time.Minute), s.ID); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool {
				ps, err := env.c.Processes(ctxFor(t, time.Minute), s.ID)
				return err == nil && len(ps) == 0
			})
			if out := sh(t, s.ID, "echo resumed"); out != "resumed\n" {
				t.Fatalf("after the resume: %q", out)
			}
		})
	}
}

// TestMemorySnapshotCutsExecClearly proves that an exec stream a memory
// snapshot cuts (gVisor) ends with a problem that says so and names the
// pid to re-attach to, not a raw protocol error ("incomplete envelope"),
// and that re-attaching reports the command's whole run time and its CPU
// time (it used to report the time since the re-attach and 0 ms of CPU).
func TestMemorySnapshotCutsExecClearly(t *testing.T) {
	s := gvisorSession(t)
	const burn = `python3 -c '
import time
for i in range(20000000): pass
time.sleep(2)
print("finished")
' # cut-stream`
	errc := make(chan error, 1)
	go func() {
		_, err := env.c.Exec(ctxFor(t, 2*time.Minute), s.ID, client.ExecRequest{Cmd: burn}, nil, nil)
		errc <- err
	}()
	pid := waitProcess(t, s.ID, "cut-stream")
	memorySnapshot(t, s.ID)
	var err error
	select {
	case err = <-errc:
	case <-time.After(time.Minute): // a hang guard
		t.Fatal("the cut exec stream never ended")
	}
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Type != "/problems/exec-stream-cut" ||
		!strings.Contains(apiErr.Detail, "memory snapshot") || !strings.Contains(apiErr.Detail, "pid "+strconv.Itoa(pid)) {
		t.Fatalf("the cut exec ended with %v; want an exec-stream-cut problem naming pid %d", err, pid)
	}
	res, err := env.c.Attach(ctxFor(t, 2*time.Minute), s.ID, pid, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The command counts to 20 million (about a second of CPU here), then
	// sleeps 2 s: its run time is over 2 s however late the re-attach
	// came, and its CPU time well over 300 ms however busy the host.
	if res.ExitCode != 0 || res.CPUMS < 300 || res.DurationMS < 2000+res.CPUMS {
		t.Fatalf("re-attach result %+v; want exit 0, its CPU time and a run time of over 2 s plus that", res)
	}
}

// TestLongStdinCalls proves stdin calls with long data (passed into the
// sandbox while it arrives, like a long exec stdin) keep their order
// behind the exec's own long stdin and reach the command whole.
func TestLongStdinCalls(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ctx := ctxFor(t, time.Minute)
	first, second := strings.Repeat("1", 300<<10), strings.Repeat("2", 200<<10)
	pid, err := env.c.ExecBackground(ctx, s.ID, client.ExecRequest{Cmd: "cat > /tmp/in", Stdin: []byte(first), KeepStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.c.SendStdin(ctx, s.ID, pid, []byte(second), false); err != nil {
		t.Fatal(err)
	}
	if err := env.c.SendStdin(ctx, s.ID, pid, []byte("3"), true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		ps, err := env.c.Processes(ctx, s.ID)
		return err == nil && len(ps) == 0
	})
	if got := string(download(t, s.ID, "/tmp/in", "")); got != first+second+"3" {
		t.Fatalf("the command read %d bytes (%.10q...), want %d in order", len(got), got, len(first+second)+1)
	}
}
