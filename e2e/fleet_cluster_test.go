package e2e

import (
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestServeCluster starts three `forkbox serve` processes with the
// cluster flags (their embedded NATS servers routing to each other on
// loopback ports, authenticated with one secret file): every host's
// `GET /v1/hosts` lists a, b and c ready; after c is killed (SIGKILL) a
// reports it lost within --host-lost-after while a and b stay ready.
func TestServeCluster(t *testing.T) {
	need(t)
	ids := []string{"a", "b", "c"}
	f := newTestFleet(t, ids, nil, "--storage-size", "1", "--host-lost-after", "4s")
	for i, id := range ids {
		f.start(t, i, "--fleet-api", "http://"+id+".test:7070")
	}
	procs := f.procs
	states := func(c *client.Client) map[string]string {
		l, err := c.Hosts(ctxFor(t, 10*time.Second))
		if err != nil {
			return nil
		}
		m := map[string]string{}
		for _, h := range l.Hosts {
			if want := "http://" + h.ID + ".test:7070"; h.API != want {
				t.Errorf("host %s lists API %q, want its --fleet-api %q", h.ID, h.API, want)
			}
			m[h.ID] = h.State
		}
		return m
	}
	waitUntil(t, 2*time.Minute, "every host lists a, b and c ready", func() bool {
		for _, p := range procs {
			s := states(p.c)
			if s["a"] != "ready" || s["b"] != "ready" || s["c"] != "ready" {
				return false
			}
		}
		return true
	})
	procs[2].kill()
	waitUntil(t, time.Minute, "a lists c lost, a and b ready", func() bool {
		s := states(procs[0].c)
		return s["c"] == "lost" && s["a"] == "ready" && s["b"] == "ready"
	})
}

// waitUntil polls cond until it holds, failing t after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
