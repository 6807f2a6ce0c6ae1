package client_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon/daemontest"
)

// BenchmarkExec measures the round trip of exec `true` through a real
// daemon (real runc sandbox, agent and SQLite), one call at a time in one
// session: with one JSON result (what `forkbox bench` times) and as an
// event stream. Besides ns/op it reports the median and the 99th
// percentile of the calls, which a shared host's load moves less. The
// benchmark asserts nothing about the figures.
func BenchmarkExec(b *testing.B) {
	d := daemontest.Start(b)
	c := d.Client
	ctx := context.Background()
	s, _, err := c.CreateSession(ctx, client.CreateRequest{DiskMB: 256}, "")
	if err != nil {
		b.Fatalf("create session: %v", err)
	}
	b.Cleanup(func() { destroy(c, s.ID) })
	trueCmd := client.ExecRequest{Argv: []string{"true"}}
	b.Run("CollectTrue", func(b *testing.B) {
		timed(b, func() error {
			out, err := c.ExecCollect(ctx, s.ID, trueCmd)
			if err == nil && out.ExitCode != 0 {
				b.Fatalf("exec true: exit code %d", out.ExitCode)
			}
			return err
		})
	})
	b.Run("StreamTrue", func(b *testing.B) {
		timed(b, func() error {
			res, err := c.Exec(ctx, s.ID, trueCmd, nil, nil)
			if err == nil && res.ExitCode != 0 {
				b.Fatalf("exec true: exit code %d", res.ExitCode)
			}
			return err
		})
	})
	b.Run("CollectShellTrue", func(b *testing.B) {
		timed(b, func() error {
			_, err := c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "true"})
			return err
		})
	})
}

// BenchmarkCreateExecDestroy measures a whole short-lived session: create,
// exec `true`, destroy, by 4 clients at once. It reports the sessions a
// second the 4 sustain beside ns/op.
func BenchmarkCreateExecDestroy(b *testing.B) {
	d := daemontest.Start(b)
	c := d.Client
	ctx := context.Background()
	b.Run("Clients4", func(b *testing.B) {
		var next sync.Mutex
		n := 0
		var wg sync.WaitGroup
		began := time.Now()
		b.ResetTimer()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					next.Lock()
					if n >= b.N {
						next.Unlock()
						return
					}
					n++
					next.Unlock()
					s, _, err := c.CreateSession(ctx, client.CreateRequest{DiskMB: 256}, "")
					if err != nil {
						b.Errorf("create: %v", err)
						return
					}
					if out, err := c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil || out.ExitCode != 0 {
						b.Errorf("exec true: %+v, %v", out, err)
					}
					if err := c.DeleteSession(ctx, s.ID); err != nil {
						b.Errorf("destroy: %v", err)
					}
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "sessions/s")
	})
}

// timed runs fn b.N times and reports the median and 99th percentile
// besides ns/op.
func timed(b *testing.B, fn func() error) {
	b.Helper()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t := time.Now()
		if err := fn(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
