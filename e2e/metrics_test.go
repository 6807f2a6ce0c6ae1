package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestMetricsMove proves the Prometheus metrics follow what happens:
// sessions by state, the create and exec latency histograms, snapshot
// bytes, warm-pool depth and egress denials (the abuse-kill counter is
// TestMinerKilled's).
func TestMetricsMove(t *testing.T) {
	name, _, c := newTenant(t, env.c, "metrics", client.TenantPolicy{EgressAllow: []string{"*"}})
	ctx := ctxFor(t, 3*time.Minute)
	creates := metricValue(t, `forkbox_session_create_seconds_count{path="cold"}`)
	execs := metricValue(t, `forkbox_exec_seconds_count`)
	running := metricValue(t, `forkbox_sessions{state="running"}`)
	snapBytes := metricValue(t, `forkbox_snapshot_bytes{kind="files"}`)

	s, _, err := c.CreateSession(ctx, client.CreateRequest{Network: &client.Network{Allow: []string{"allowed.test:80"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.ID)
	if v := metricValue(t, `forkbox_session_create_seconds_count{path="cold"}`); v != creates+1 {
		t.Errorf("create histogram count %v → %v", creates, v)
	}
	if v := metricValue(t, `forkbox_sessions{state="running"}`); v != running+1 {
		t.Errorf("running sessions %v → %v", running, v)
	}
	// A refused destination (the proxy checks the name; nothing is dialled).
	var out strings.Builder
	if _, err := c.Exec(ctx, s.ID, client.ExecRequest{Cmd: `python3 -c '
import urllib.request
try:
    urllib.request.urlopen("http://other.test/", timeout=10)
except Exception as e:
    print(e)
'; head -c 1000000 /dev/urandom > /home/user/blob`}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if v := metricValue(t, `forkbox_exec_seconds_count`); v != execs+1 {
		t.Errorf("exec histogram count %v → %v", execs, v)
	}
	waitFor(t, func() bool { return metricValue(t, `forkbox_egress_denied_total{tenant="`+name+`"}`) >= 1 })
	sn, err := c.Snapshot(ctx, s.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer env.c.DeleteSnapshot(context.Background(), sn.ID, true)
	if v := metricValue(t, `forkbox_snapshot_bytes{kind="files"}`); v < snapBytes+1e6 {
		t.Errorf("snapshot bytes %v → %v after a snapshot holding 1 MB", snapBytes, v)
	}
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if v := metricValue(t, `forkbox_sessions{state="running"}`); v != running {
		t.Errorf("running sessions after the delete: %v, want %v", v, running)
	}
	// Pool depth: a pool of one fills, and empties when set to 0.
	pool := client.Pool{Template: "base", Size: 1, CPU: 0.25, MemoryMB: 96, Pids: 64, DiskMB: 64}
	if _, err := env.c.SetPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	defer func() {
		pool.Size = 0
		env.c.SetPool(context.Background(), pool)
	}()
	waitFor(t, func() bool { return metricValue(t, `forkbox_pool_ready{template="base"}`) == 1 })
	pool.Size = 0
	if _, err := env.c.SetPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return metricValue(t, `forkbox_pool_ready{template="base"}`) == 0 })
}
