package drivertest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/internal/envdpb/processpb"
	"github.com/forkbox/forkbox/runtime"
)

// forkLoop forks up to 100 children that wait, counts those it got, kills
// them and prints the count.
const forkLoop = `import os, signal
kids = []
try:
    for _ in range(100):
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        kids.append(pid)
except OSError:
    pass
for k in kids:
    os.kill(k, 9)
    os.waitpid(k, 0)
print(len(kids))
`

// testKillProcessGroup: a process group is killed from outside, including
// members that ignore signals, and other processes survive.
func (e *env) testKillProcessGroup(t *testing.T) {
	sb := e.start(t, defaultLimits)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan *processpb.ProcessEvent_EndEvent, 1)
	pidc := make(chan uint32, 1)
	go func() {
		f := false
		st, err := sb.process.Start(ctx, connect.NewRequest(&processpb.StartRequest{Stdin: &f,
			Process: &processpb.ProcessConfig{Cmd: "sh", Args: []string{"-c", "trap '' TERM; sleep 300 & sleep 301 & wait"}}}))
		if err != nil {
			done <- nil
			return
		}
		for st.Receive() {
			if s := st.Msg().GetEvent().GetStart(); s != nil {
				pidc <- s.GetPid()
			}
			if end := st.Msg().GetEvent().GetEnd(); end != nil {
				done <- end
				return
			}
		}
		done <- nil
	}()
	pid := <-pidc
	if _, err := e.driver.KillProcessGroup(ctx, sb.id, 1, 9); err == nil {
		t.Fatal("KillProcessGroup accepted the agent's own group (pgid 1)")
	}
	waitFor(t, func() bool {
		_, out, _ := sb.run(t, ctx, "sh", "-c", "ps -eo pgid=,comm= | grep -c sleep")
		return strings.TrimSpace(out) == "2"
	})
	n, err := e.driver.KillProcessGroup(ctx, sb.id, int(pid), 9)
	if err != nil || n != 3 {
		t.Fatalf("KillProcessGroup: %d processes, %v; want 3", n, err)
	}
	if end := <-done; end == nil || end.GetExited() {
		t.Fatalf("group leader ended %+v, want a signal death", end)
	}
	if _, out, _ := sb.run(t, ctx, "sh", "-c", "ps -eo comm= | grep -c sleep || true"); strings.TrimSpace(out) != "0" {
		t.Fatalf("%s sleeps survived", out)
	}
}

// testPause: when the driver can pause, a paused sandbox makes no progress
// and resumes where it was.
func (e *env) testPause(t *testing.T) {
	if !e.driver.Capabilities().Pause {
		if err := e.driver.Pause(context.Background(), "x"); err == nil {
			t.Fatal("driver without the pause capability paused")
		}
		t.Skip("driver does not declare the pause capability")
	}
	sb := e.start(t, defaultLimits)
	ctx := context.Background()
	before, _ := e.driver.Stats(ctx, sb.id)
	spinCtx, stopSpin := context.WithCancel(ctx)
	defer stopSpin()
	f := false
	spin, err := sb.process.Start(spinCtx, connect.NewRequest(&processpb.StartRequest{Stdin: &f,
		Process: &processpb.ProcessConfig{Cmd: "sh", Args: []string{"-c", "while :; do :; done"}}}))
	if err != nil || !spin.Receive() {
		t.Fatalf("start spinner: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := e.driver.Pause(ctx, sb.id); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.driver.Status(ctx, sb.id); st != runtime.StatusPaused {
		t.Fatalf("status %q after pause", st)
	}
	a, _ := e.driver.Stats(ctx, sb.id)
	time.Sleep(300 * time.Millisecond)
	b, _ := e.driver.Stats(ctx, sb.id)
	// The runtime's own threads may tick (gVisor's Sentry: about 5 %
	// of a core); a running spinner would use 0.15 or more.
	if b.CPUSeconds-a.CPUSeconds > 0.05 {
		t.Fatalf("paused sandbox used %.3f CPU-s", b.CPUSeconds-a.CPUSeconds)
	}
	if err := e.driver.Resume(ctx, sb.id); err != nil {
		t.Fatal(err)
	}
	// A runtime that reads stats through a CLI (runsc events) can fail a
	// reading under load: the spinner must show progress within the hang
	// guard, read by read.
	var c runtime.Stats
	deadline := time.Now().Add(30 * time.Second)
	for {
		time.Sleep(100 * time.Millisecond)
		var err error
		c, err = e.driver.Stats(ctx, sb.id)
		if err == nil && c.CPUSeconds > b.CPUSeconds && c.CPUSeconds > before.CPUSeconds {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("resumed sandbox made no progress: %.3f -> %.3f (%v)", b.CPUSeconds, c.CPUSeconds, err)
		}
	}
}

// testPauseDuringKill: a Pause that lands while KillProcessGroup has the
// sandbox frozen for its walk still leaves it paused (the kill's own thaw
// must not undo it), and a kill on a paused sandbox does not thaw it.
func (e *env) testPauseDuringKill(t *testing.T) {
	if !e.driver.Capabilities().Pause {
		t.Skip("driver does not declare the pause capability")
	}
	sb := e.start(t, defaultLimits)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Many processes make the kill's walk take a while.
	if end, out, _ := sb.run(t, ctx, "sh", "-c", "for i in $(seq 100); do sleep 1000 & done; echo started"); end == nil || !strings.Contains(out, "started") {
		t.Fatalf("start sleepers: %+v %q", end, out)
	}
	// Up to 40 rounds; a driver whose kills are runtime CLI calls (gVisor)
	// stops after a minute, once it has done 5.
	began := time.Now()
	for i := 0; i < 40 && (i < 5 || time.Since(began) < time.Minute); i++ {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			// No such group: the walk freezes, finds nothing, thaws.
			_, _ = e.driver.KillProcessGroup(ctx, sb.id, 99999, 9)
		}()
		time.Sleep(time.Duration(i%8) * 100 * time.Microsecond)
		if err := e.driver.Pause(ctx, sb.id); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if st, _ := e.driver.Status(ctx, sb.id); st != runtime.StatusPaused {
			t.Fatalf("round %d: status %q after a pause that raced a process-group kill", i, st)
		}
		if _, err := e.driver.KillProcessGroup(ctx, sb.id, 99999, 9); err != nil {
			t.Fatal(err)
		}
		if st, _ := e.driver.Status(ctx, sb.id); st != runtime.StatusPaused {
			t.Fatalf("round %d: status %q after a kill in a paused sandbox", i, st)
		}
		if err := e.driver.Resume(ctx, sb.id); err != nil {
			t.Fatal(err)
		}
	}
}
