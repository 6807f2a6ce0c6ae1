package e2e

import (
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestMonitorRoundCost runs the host monitor over a dozen sessions of
// both tiers and reports what its 5 s round costs per session, from the
// metrics it now publishes: the round-duration histogram and the overrun
// counter. (A gVisor reading started a runsc process per session and
// round, about 50 ms each on an idle host; the round overran its 5 s with
// about 20 sessions on a loaded one.) Nothing is asserted about the time
// itself: the test proves the metrics count real rounds.
func TestMonitorRoundCost(t *testing.T) {
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 5*time.Minute)
	reqs := make([]client.CreateRequest, 0, 12)
	for i := 0; i < 8; i++ {
		reqs = append(reqs, client.CreateRequest{CPU: 0.25, MemoryMB: 128})
	}
	if _, err := exec.LookPath("runsc"); err == nil {
		for i := 0; i < 4; i++ {
			reqs = append(reqs, client.CreateRequest{CPU: 0.25, MemoryMB: 128, Isolation: "gvisor"})
		}
	} else {
		t.Log("runsc is not installed: runc sessions only")
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(reqs))
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			s, _, err := o.c.CreateSession(ctx, req, "")
			if err != nil {
				errs <- fmt.Errorf("create %s: %w", req.Isolation, err)
				return
			}
			t.Logf("create %s %s: %v", req.Isolation, s.ID, time.Since(start))
			// A few processes, and in some runc sessions a busy one (a busy
			// gVisor sandbox at a quarter core starves its own agent).
			cmd := "for i in 1 2 3 4 5 6 7 8; do sleep 600 & done"
			if i%4 == 0 && req.Isolation == "" {
				cmd += "; while :; do :; done"
			}
			start = time.Now()
			_, err = o.c.Exec(ctx, s.ID, client.ExecRequest{Cmd: cmd, Background: true}, nil, nil)
			if err != nil {
				err = fmt.Errorf("exec in %s %s after %v: %w", req.Isolation, s.ID, time.Since(start), err)
			}
			errs <- err
		}()
		if i%2 == 1 {
			wg.Wait() // two creates at a time on a 2-core host
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	metric := func(series string) float64 { return metricOf(t, o.d.URL, o.key, series) }
	// Wait for a round that saw them all, then measure over the next ones.
	var count0, sum0 float64
	waitForLong(t, 30*time.Second, func() bool {
		count0, sum0 = metric("forkbox_monitor_round_seconds_count"), metric("forkbox_monitor_round_seconds_sum")
		return count0 >= 1
	})
	time.Sleep(100 * time.Millisecond)
	waitForLong(t, 30*time.Second, func() bool { return metric("forkbox_monitor_round_seconds_count") >= count0+3 })
	count, sum := metric("forkbox_monitor_round_seconds_count"), metric("forkbox_monitor_round_seconds_sum")
	rounds, took := count-count0, sum-sum0
	if rounds < 3 || took <= 0 {
		t.Fatalf("round histogram: %v rounds taking %v s", rounds, took)
	}
	per := time.Duration(took / rounds * float64(time.Second))
	t.Logf("monitor round over %d sessions: %v per round, %v per session; %v overruns in all",
		len(reqs), per, per/time.Duration(len(reqs)), metric("forkbox_monitor_overruns_total"))
}

// waitForLong is waitFor with its own limit (a hang guard).
func waitForLong(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
