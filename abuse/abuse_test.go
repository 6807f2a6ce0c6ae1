package abuse

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// feed observes n samples of id, interval apart from t0, with CPU use
// rate (cores) and a 1-core quota, and returns the first verdict.
func feed(d *Detector, id string, t0 time.Time, n int, rate float64, procs []Process) (*Verdict, int) {
	cpu := 0.0
	for i := 0; i < n; i++ {
		now := t0.Add(time.Duration(i) * d.cfg.Interval)
		if v := d.Observe(id, Sample{Time: now, CPUSeconds: cpu, CPULimit: 1}, func() []Process { return procs }); v != nil {
			return v, i
		}
		cpu += rate * d.cfg.Interval.Seconds()
	}
	return nil, n
}

// TestMinerByName proves a process named like a miner at full CPU is
// mining once the CPU has been sustained for SustainedCPU, and not before.
func TestMinerByName(t *testing.T) {
	d := New(Config{})
	v, i := feed(d, "s", time.Now(), 20, 1, []Process{{Name: "sh"}, {Name: "xmrig", Cmdline: "/tmp/xmrig -o x"}})
	if v == nil || v.Pattern != Mining || !strings.Contains(v.Reason, "xmrig") {
		t.Fatalf("verdict %+v", v)
	}
	// Samples 5 s apart: 20 s of history is the fifth sample.
	if i != 4 {
		t.Fatalf("decided at sample %d, want 4 (after 20 s)", i)
	}
}

// TestMiningSignals proves each mining signal counts (a stratum URL in a
// command line, a miner's path as argv[0], an allowed connection to a
// pool domain within the window), and none counts without sustained CPU.
func TestMiningSignals(t *testing.T) {
	t0 := time.Now()
	for name, c := range map[string]struct {
		procs  []Process
		egress func(*Detector)
	}{
		"stratum": {procs: []Process{{Name: "python3", Cmdline: "python3 m.py stratum+tcp://x:1"}}},
		"argv0":   {procs: []Process{{Name: "a.out", Cmdline: "/opt/cpuminer-multi/cpuminer -a x"}}},
		"pool domain": {egress: func(d *Detector) {
			d.Egress("s", Egress{Time: t0, Host: "eu.SupportXMR.com.", Port: 443, Allowed: true})
		}},
	} {
		d := New(Config{})
		if c.egress != nil {
			c.egress(d)
		}
		if v, _ := feed(d, "s", t0, 10, 1, c.procs); v == nil || v.Pattern != Mining {
			t.Errorf("%s: verdict %+v", name, v)
		}
		d = New(Config{})
		if c.egress != nil {
			c.egress(d)
		}
		if v, _ := feed(d, "s", t0, 10, 0.3, c.procs); v != nil {
			t.Errorf("%s at 30%% CPU: verdict %+v", name, v)
		}
	}
}

// TestBusyHonestProcessNotMining proves full CPU without a mining signal,
// or a signal older than the window, is no verdict.
func TestBusyHonestProcessNotMining(t *testing.T) {
	t0 := time.Now()
	d := New(Config{})
	if v, _ := feed(d, "s", t0, 30, 1, []Process{{Name: "python3", Cmdline: "python3 train.py"}}); v != nil {
		t.Fatalf("verdict %+v", v)
	}
	d = New(Config{})
	d.Egress("s", Egress{Time: t0.Add(-2 * time.Minute), Host: "pool.minexmr.com", Port: 443, Allowed: true})
	if v, _ := feed(d, "s", t0, 10, 1, nil); v != nil {
		t.Fatalf("stale signal: verdict %+v", v)
	}
	// Refused attempts and DNS lookups of a pool, or a stratum port, are
	// no signal: content an agent reads can make it try them.
	d = New(Config{})
	d.Egress("s", Egress{Time: t0, Host: "pool.minexmr.com", Port: 443})
	d.Egress("s", Egress{Time: t0, Host: "pool.minexmr.com", Port: 53, Allowed: true, DNS: true})
	d.Egress("s", Egress{Time: t0, Host: "198.51.100.1", Port: 3333, Allowed: true})
	if v, _ := feed(d, "s", t0, 10, 1, nil); v != nil {
		t.Fatalf("weak signals: verdict %+v", v)
	}
}

// TestScanning proves many refused connections to many destinations
// within the window is scanning, while as many to one destination (a
// retrying client), to web sites by name (a browser agent) or spread over
// longer than the window is not.
func TestScanning(t *testing.T) {
	t0 := time.Now()
	d := New(Config{})
	for i := 0; i < 40; i++ {
		d.Egress("s", Egress{Time: t0, Host: "198.51.100.7", Port: 1000 + i})
	}
	if v := d.Observe("s", Sample{Time: t0, CPULimit: 1}, nil); v == nil || v.Pattern != Scanning {
		t.Fatalf("scan: %+v", v)
	}
	d = New(Config{})
	for i := 0; i < 100; i++ {
		d.Egress("s", Egress{Time: t0, Host: "api.example.com", Port: 443})
		d.Egress("s", Egress{Time: t0, Host: fmt.Sprintf("ads%d.example.com", i), Port: 443})
	}
	if v := d.Observe("s", Sample{Time: t0, CPULimit: 1}, nil); v != nil {
		t.Fatalf("one destination: %+v", v)
	}
	d = New(Config{})
	for i := 0; i < 40; i++ {
		d.Egress("s", Egress{Time: t0.Add(time.Duration(i) * 5 * time.Second), Host: "198.51.100.7", Port: 1000 + i})
	}
	if v := d.Observe("s", Sample{Time: t0.Add(200 * time.Second), CPULimit: 1}, nil); v != nil {
		t.Fatalf("slow refusals: %+v", v)
	}
}

// TestForkBomb proves pids-limit refusals in PidsHits samples within the
// window is a fork bomb, and one burst is not.
func TestForkBomb(t *testing.T) {
	t0 := time.Now()
	d := New(Config{})
	var v *Verdict
	for i := 0; i < 6 && v == nil; i++ {
		v = d.Observe("s", Sample{Time: t0.Add(time.Duration(i) * 5 * time.Second), CPULimit: 1, PidsLimitHits: int64(i * 100)}, nil)
	}
	if v == nil || v.Pattern != ForkBomb {
		t.Fatalf("verdict %+v", v)
	}
	d = New(Config{})
	hits := []int64{0, 500, 500, 500, 500, 500} // one burst, then well below the limit
	for i, h := range hits {
		if v := d.Observe("s", Sample{Time: t0.Add(time.Duration(i) * 5 * time.Second), CPULimit: 1, PidsLimitHits: h,
			Pids: 10, PidsLimit: 64}, nil); v != nil {
			t.Fatalf("one burst: %+v", v)
		}
	}
	// A sandbox sitting at its limit (no new refusals counted) is one too.
	d = New(Config{})
	v = nil
	for i := 0; i < 6 && v == nil; i++ {
		v = d.Observe("s", Sample{Time: t0.Add(time.Duration(i) * 5 * time.Second), CPULimit: 1, Pids: 64, PidsLimit: 64}, nil)
	}
	if v == nil || v.Pattern != ForkBomb {
		t.Fatalf("at the limit: verdict %+v", v)
	}
	d.Forget("s")
	if len(d.by) != 0 {
		t.Fatal("Forget kept evidence")
	}
}

// TestPidsLimitStop proves a sandbox that stopped at its host pids limit
// is a fork bomb at once, and that its evidence is dropped: a new sandbox
// with the same id starts clean.
func TestPidsLimitStop(t *testing.T) {
	d := New(Config{})
	now := time.Now()
	d.Observe("s", Sample{Time: now, Pids: 64, PidsLimit: 64}, nil)
	v := d.PidsLimitStop("s")
	if v.Pattern != ForkBomb || !strings.Contains(v.Reason, "pids limit") {
		t.Fatalf("verdict %+v", v)
	}
	for i := 1; i < d.cfg.PidsHits; i++ {
		if v := d.Observe("s", Sample{Time: now.Add(time.Duration(i) * time.Second), Pids: 64, PidsLimit: 64}, nil); v != nil {
			t.Fatalf("evidence survived the stop: verdict %+v after %d samples", v, i)
		}
	}
}
