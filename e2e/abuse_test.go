package e2e

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestMinerKilled proves the abuse detector: a CPU spinner named like a
// miner (xmrig) is killed within 60 s of starting, its session ends with
// reason abuse and later calls get 410 saying why, its tenant is flagged
// (and, by its policy, suspended until an admin clears the flag), the
// kill is an audit record, and the abuse-kill metric counts it.
func TestMinerKilled(t *testing.T) {
	// The package's only parallel test: it runs after all the others,
	// when the CPU-heavy packages beside this one (bench, runsc) are done
	// and a spinner gets near its quota, as a miner would on a host that
	// is not a test machine.
	t.Parallel()
	name, key, c := newTenant(t, env.c, "miner", client.TenantPolicy{SuspendWhenFlagged: true})
	ctx := ctxFor(t, 3*time.Minute)
	before := metricValue(t, `forkbox_abuse_kills_total{pattern="mining"}`)
	s, _, err := c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	// A copy of yes(1) named xmrig: full CPU, and the name of a miner.
	started := time.Now()
	if _, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{Cmd: "cp /usr/bin/yes /tmp/xmrig && exec /tmp/xmrig > /dev/null"}); err != nil {
		t.Fatal(err)
	}
	got := waitEnded(t, c, s.ID, 90*time.Second)
	took := time.Since(started)
	if got == nil || got.State != "terminated" || got.Reason != "abuse" || !strings.Contains(got.Detail, "xmrig") {
		t.Fatalf("miner session after %s: %+v", took, got)
	}
	// NFR-04: decided within 60 s (this is the requirement, not a
	// performance figure: the detector decides after 20 s at half its quota or more and
	// samples every 5 s).
	if took > 60*time.Second {
		t.Fatalf("miner killed after %s, want within 60 s", took)
	}
	t.Logf("miner killed %s after it started: %s", took.Round(time.Second), got.Detail)
	status, _, body := rawCall(t, key, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"argv": []string{"true"}})
	if status != http.StatusGone || problemType(body) != "/problems/session-terminated" || !strings.Contains(string(body), "abuse") {
		t.Fatalf("exec after the kill: %d %s", status, body)
	}
	tn, err := env.c.GetTenant(ctx, name)
	if err != nil || tn.FlaggedAt == nil || !strings.Contains(tn.FlagReason, "mining") {
		t.Fatalf("tenant after the kill: %+v %v", tn, err)
	}
	list, err := c.Audit(ctx, client.AuditFilter{Session: s.ID, Kind: "abuse"})
	if err != nil || len(list.Records) != 1 || list.Records[0].Outcome != "denied" {
		t.Fatalf("abuse audit records: %+v %v", list, err)
	}
	if after := metricValue(t, `forkbox_abuse_kills_total{pattern="mining"}`); after != before+1 {
		t.Fatalf("abuse kill metric went from %v to %v", before, after)
	}
	// Its policy suspends it while flagged; an admin clears the flag.
	if status, _, body := rawCall(t, key, "POST", "/v1/sessions", map[string]any{}); status != http.StatusForbidden ||
		problemType(body) != "/problems/tenant-suspended" {
		t.Fatalf("create while flagged: %d %s", status, body)
	}
	if _, err := env.c.UpdateTenant(ctx, name, tn.Policy, true); err != nil {
		t.Fatal(err)
	}
	if tn, _ := env.c.GetTenant(ctx, name); tn.FlaggedAt != nil {
		t.Fatalf("flag not cleared: %+v", tn)
	}
	s2, _, err := c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatalf("create after the flag was cleared: %v", err)
	}
	c.DeleteSession(ctx, s2.ID)
}

// TestBusyButHonestNotKilled proves full CPU alone is not abuse: a spinner
// with an ordinary name runs past the detector's window untouched.
func TestBusyButHonestNotKilled(t *testing.T) {
	_, _, c := newTenant(t, env.c, "busy", client.TenantPolicy{})
	ctx := ctxFor(t, 2*time.Minute)
	s, _, err := c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)
	if _, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{Cmd: "exec yes > /dev/null"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(35 * time.Second)
	got, err := c.GetSession(ctx, s.ID)
	if err != nil || got.State != "running" {
		t.Fatalf("honest busy session after 35 s: %+v %v", got, err)
	}
}

// metricValue scrapes /metrics with the admin key and returns the sample
// named series (name{labels} exactly as exposed), 0 when absent.
func metricValue(t *testing.T, series string) float64 {
	t.Helper()
	return metricOf(t, env.d.URL, env.key, series)
}

// metricOf is metricValue of the daemon at url (admin key key).
func metricOf(t *testing.T, url, key, series string) float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctxFor(t, time.Minute), "GET", url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %q", series, v)
			}
			return f
		}
	}
	return 0
}

// TestScannerKilled proves scanning is abuse: a session whose network
// allows one host and that tries forty others (plain HTTP, which the
// egress proxy refuses by name, dialling nothing) is killed with reason
// abuse (pattern scanning) and its tenant flagged.
func TestScannerKilled(t *testing.T) {
	name, _, c := newTenant(t, env.c, "scanner", client.TenantPolicy{EgressAllow: []string{"*"}})
	ctx := ctxFor(t, 3*time.Minute)
	s, _, err := c.CreateSession(ctx, client.CreateRequest{Network: &client.Network{Allow: []string{"allowed.test:80"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if _, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{Cmd: `python3 -c '
import http.client
for i in range(1, 41):
    try:
        c = http.client.HTTPConnection("198.51.100.%d" % i, 80, timeout=3)
        c.request("GET", "/")
        c.getresponse()
    except Exception:
        pass
'`}); err != nil {
		t.Fatal(err)
	}
	got := waitEnded(t, c, s.ID, 90*time.Second)
	if got == nil || got.State != "terminated" || got.Reason != "abuse" || !strings.Contains(got.Detail, "scanning") {
		t.Fatalf("scanner session after %s: %+v", time.Since(started), got)
	}
	t.Logf("scanner killed %s after it started: %s", time.Since(started).Round(time.Second), got.Detail)
	if tn, err := env.c.GetTenant(ctx, name); err != nil || !strings.Contains(tn.FlagReason, "scanning") {
		t.Fatalf("tenant after the kill: %+v %v", tn, err)
	}
}

// TestRepeatedForkBombKilled proves a fork bomb that keeps hitting the
// pids limit is abuse (one burst is contained by the limit alone:
// TestForkBombHitsPidsLimit): the session ends with pattern fork-bomb.
func TestRepeatedForkBombKilled(t *testing.T) {
	_, _, c := newTenant(t, env.c, "bomber", client.TenantPolicy{})
	ctx := ctxFor(t, 3*time.Minute)
	s, _, err := c.CreateSession(ctx, client.CreateRequest{Pids: 64}, "")
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if _, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{Argv: []string{"python3", "-c", forkBomb}}); err != nil {
		t.Fatal(err)
	}
	got := waitEnded(t, c, s.ID, 90*time.Second)
	if got == nil || got.State != "terminated" || got.Reason != "abuse" || !strings.Contains(got.Detail, "pids limit") {
		t.Fatalf("fork bomb session after %s: %+v", time.Since(started), got)
	}
	t.Logf("fork bomb killed %s after it started: %s", time.Since(started).Round(time.Second), got.Detail)
}

// waitEnded polls session id until it has ended, at most within (a hang
// guard), and returns its last record.
func waitEnded(t *testing.T, c *client.Client, id string, within time.Duration) *client.Session {
	t.Helper()
	ctx := ctxFor(t, within+time.Minute)
	deadline := time.Now().Add(within)
	var got *client.Session
	for time.Now().Before(deadline) {
		var err error
		if got, err = c.GetSession(ctx, id); err == nil && got.State == "terminated" {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	return got
}

// forkBomb is a Python program that forks sleepers until the pids limit
// refuses and keeps trying (a shell loop does not keep it up: dash exits at
// its first failed fork, and the bomb dies out).
const forkBomb = `import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        time.sleep(0.01)
`
