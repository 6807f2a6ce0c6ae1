package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// testWriter forwards progress lines to t.Log.
type testWriter struct{ t *testing.T }

// Write logs p (one or more lines) through t.Log.
func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestRun runs the whole benchmark with 3 iterations against a private
// daemon, peers included, and checks the shape of the report (never how
// fast anything was).
func TestRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the private daemon creates namespaces, cgroups and mounts")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("needs runc in PATH (apt-get install runc)")
	}
	agent := os.Getenv("FORKBOX_AGENT")
	if agent == "" {
		t.Skip("set FORKBOX_AGENT to the forkbox-agent binary (make test does)")
	}
	// The replicate rows start hosts as `forkbox serve` processes; this
	// test's executable is not forkbox.
	bin := os.Getenv("FORKBOX_BIN")
	if bin == "" {
		t.Skip("set FORKBOX_BIN to the forkbox binary (make test does)")
	}
	// The benchmark must start its own daemon, whatever the environment says.
	t.Setenv("FORKBOX_URL", "")
	t.Setenv("FORKBOX_API_KEY", "")

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// 20 and 30 MB instead of 500 and 300, and few idle sandboxes for a
	// short time, keep the test short; the shape is the same. Every group
	// runs but two: fork 64, which is the fork group's code with 64 children (and
	// 64 runc containers beside them each round), which would load the
	// host for minutes while the other packages' tests run; and the fleet
	// simulation, whose rows are of another shape (TestFleetSimStep).
	var only []string
	for _, g := range Groups {
		if g != GroupFork64 && g != GroupFleetSim {
			only = append(only, g)
		}
	}
	rep, err := Run(ctx, Options{N: 3, AgentPath: agent, ForkboxPath: bin, SnapshotMB: 20, UnsyncedMB: 30, StorageImageBytes: 4 << 30,
		Only: only, Sustain: 2 * time.Second, IdleRunc: 5, IdleGVisor: 2, IdleWindow: 2 * time.Second,
		Progress: testWriter{t}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := rep.ForkboxErr(); err != nil {
		t.Fatal(err)
	}

	want := map[string]bool{OpCreate: true, OpExec: true, OpDestroy: true, OpRun: true,
		OpPause: true, OpResume: true, OpSnapshot: true, OpFork: true, OpPoolCreate: true,
		OpSnapshotUnsynced: true, OpFrozenUnsynced: true, OpFrozenSynced: true,
		OpRestoreFiles: true, OpSustained: true, OpCodeWarm: true, OpCodeFirst: true, OpCodeFirstCold: true, OpCodeChart: true, OpEgressRunc: true, OpEgressGVisor: true,
		OpBrokerHTTPS: true, OpPassthroughHTTPS: true, OpDiff: true, OpMerge: true, OpForkRun: true, OpForkExecs: true,
		OpBuildCold: true, OpBuildCached: true, OpBuildFirst: true}
	for _, r := range rep.Results {
		t.Logf("%-24s %-8s n=%d p50=%.2f p99=%.2f mean=%.2f note=%q err=%q",
			r.Operation, r.System, r.N, r.P50MS, r.P99MS, r.MeanMS, r.Note, r.Error)
		if r.System != SystemForkbox {
			if r.Error == "" && r.Note == "" && r.N != 3 && r.Operation != OpSustained {
				t.Errorf("%s %s: n = %d, want 3", r.System, r.Operation, r.N)
			}
			if r.Error == "" && r.N > 0 && (r.PairedRatio == nil || *r.PairedRatio <= 0 || r.Pairs == 0) {
				t.Errorf("%s %s: paired ratio %v over %d pairs, want one", r.System, r.Operation, r.PairedRatio, r.Pairs)
			}
			continue
		}
		delete(want, r.Operation)
		wantMB, sized := map[string]int{OpSnapshot: 20, OpFork: 20, OpRestoreFiles: 20, OpDiff: 20, OpMerge: 20,
			OpSnapshotUnsynced: 30, OpFrozenUnsynced: 30, OpFrozenSynced: 30}[r.Operation]
		if sized && r.DataMB != wantMB || !sized && (r.DataMB == 20 || r.DataMB == 30) {
			t.Errorf("forkbox %s: data_mb = %d", r.Operation, r.DataMB)
		}
		if r.Operation == OpSustained {
			if r.N == 0 || r.PerSecond == nil || *r.PerSecond <= 0 {
				t.Errorf("forkbox sustained: n = %d, rate %v, want cycles and a rate", r.N, r.PerSecond)
			}
		} else if r.N != 3 {
			t.Errorf("forkbox %s: n = %d, want 3", r.Operation, r.N)
		}
		if r.P50MS <= 0 || r.P99MS <= 0 || r.MeanMS <= 0 {
			t.Errorf("forkbox %s: durations p50=%v p99=%v mean=%v, want all > 0", r.Operation, r.P50MS, r.P99MS, r.MeanMS)
		}
		if r.P50MS > r.P99MS {
			t.Errorf("forkbox %s: p50 %v > p99 %v", r.Operation, r.P50MS, r.P99MS)
		}
	}
	for op := range want {
		t.Errorf("no forkbox row for %q", op)
	}
	if len(rep.Idle) == 0 || rep.Idle[0].Isolation != "runc" || rep.Idle[0].Sandboxes != 5 || rep.Idle[0].Error != "" ||
		rep.Idle[0].CgroupMemMiBPer <= 0 {
		t.Errorf("idle rows = %+v, want runc with 5 sandboxes measured", rep.Idle)
	}

	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("table:\n%s", table.String())
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON report does not decode: %v", err)
	}
	if len(back.Results) != len(rep.Results) {
		t.Errorf("JSON report has %d rows, want %d", len(back.Results), len(rep.Results))
	}
	if back.Storage == "" {
		t.Errorf("JSON report names no storage driver")
	}
}

// TestPercentile checks the nearest-rank percentiles on small samples.
func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		var out []time.Duration
		for _, v := range vs {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		doc    string
		sorted []time.Duration
		pct    int
		wantMS int
	}{
		{doc: "one sample is every percentile", sorted: ms(7), pct: 50, wantMS: 7},
		{doc: "p50 of 4 is the 2nd", sorted: ms(1, 2, 3, 4), pct: 50, wantMS: 2},
		{doc: "p50 of 5 is the 3rd", sorted: ms(1, 2, 3, 4, 5), pct: 50, wantMS: 3},
		{doc: "p99 of 30 is the largest", sorted: ms(seq(30)...), pct: 99, wantMS: 30},
		{doc: "p99 of 100 is the 99th", sorted: ms(seq(100)...), pct: 99, wantMS: 99},
		{doc: "p99 of 200 is the 198th", sorted: ms(seq(200)...), pct: 99, wantMS: 198},
	} {
		if got := percentile(tc.sorted, tc.pct); got != time.Duration(tc.wantMS)*time.Millisecond {
			t.Errorf("%s: got %v, want %d ms", tc.doc, got, tc.wantMS)
		}
	}
}

// seq returns 1..n.
func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// TestFinish checks targets, notes and the row order on a made-up
// report.
func TestFinish(t *testing.T) {
	rate := 48.0
	rep := &Report{Results: []Result{
		{Operation: OpExec, System: SystemRunc, N: 1, P50MS: 60, P99MS: 60, MeanMS: 60},
		{Operation: OpExec, System: SystemForkbox, N: 1, P50MS: 2, P99MS: 2, MeanMS: 2},
		{Operation: OpCreate, System: SystemForkbox, N: 1, P50MS: 90, P99MS: 90, MeanMS: 90},
		{Operation: OpRun, System: SystemPodman, Error: "boom"},
		{Operation: OpPoolCreate, System: SystemForkbox, N: 1, P50MS: 3, P99MS: 3, MeanMS: 3},
		{Operation: OpFork, System: SystemForkbox, N: 1, P50MS: 80, P99MS: 80, MeanMS: 80},
		{Operation: OpFork64, System: SystemForkbox, N: 1, P50MS: 1280, P99MS: 1280, MeanMS: 1280},
		{Operation: OpSnapshot, System: SystemForkbox, N: 1, P50MS: 20, P99MS: 20, MeanMS: 20},
		{Operation: OpSnapshot, System: SystemCopy, N: 1, P50MS: 400, P99MS: 400, MeanMS: 400, Note: "reference: cp"},
		{Operation: OpSustained, System: SystemForkbox, N: 90, P50MS: 70, P99MS: 90, MeanMS: 75, PerSecond: &rate},
	}, Storage: "btrfs"}
	rep.finish()
	byKey := map[string]Result{}
	for _, r := range rep.Results {
		byKey[r.Operation+"/"+r.System] = r
	}
	if r := byKey[OpExec+"/"+SystemForkbox]; r.Target == nil || !r.Target.Met || r.Target.P50MS != 3 {
		t.Errorf("forkbox exec target = %+v, want met at 3 ms", r.Target)
	}
	if r := byKey[OpExec+"/"+SystemRunc]; r.Target != nil || r.PairedRatio != nil {
		t.Errorf("runc exec = %+v, want no target and no ratio made up from p50s", r)
	}
	if r := byKey[OpCreate+"/"+SystemForkbox]; r.Target == nil || r.Target.Met {
		t.Errorf("forkbox create target = %+v, want missed", r.Target)
	}
	if r := byKey[OpSnapshot+"/"+SystemCopy]; r.Note != "reference: cp" {
		t.Errorf("plain cp snapshot = %+v, want its own note", r)
	}
	if r := byKey[OpSnapshot+"/"+SystemForkbox]; r.Target == nil || !r.Target.Met || r.Target.P50MS != 50 {
		t.Errorf("forkbox snapshot target = %+v, want met at 50 ms", r.Target)
	}
	if r := byKey[OpFork+"/"+SystemForkbox]; r.Target == nil || r.Target.P50MS != 80 || !r.Target.Met || !strings.Contains(r.Note, "10.00 ms per session") {
		t.Errorf("forkbox fork = %+v, want an 80 ms target met and 10 ms per session", r)
	}
	if r := byKey[OpFork64+"/"+SystemForkbox]; r.Target == nil || r.Target.P50MS != 1000 || r.Target.Met || !strings.Contains(r.Note, "20.00 ms per session") {
		t.Errorf("forkbox fork 64 = %+v, want a 1000 ms target missed and 20 ms per session", r)
	}
	if r := byKey[OpPoolCreate+"/"+SystemForkbox]; r.Target == nil || r.Target.P50MS != 3 || !strings.Contains(r.Note, "cold create p50 90.00 ms = 30.0x") {
		t.Errorf("forkbox pool create = %+v, want a 3 ms target and the cold create compared", r)
	}
	if r := byKey[OpSustained+"/"+SystemForkbox]; r.Target == nil || r.Target.MinPerSecond != 50 || r.Target.Met {
		t.Errorf("forkbox sustained target = %+v, want >= 50 a second, missed at 48", r.Target)
	}
	if rep.Results[0].Operation != OpFork || rep.Results[1].Operation != OpFork64 {
		t.Errorf("rows not in table order: %s, %s", rep.Results[0].Operation, rep.Results[1].Operation)
	}
	if rep.ForkboxErr() != nil {
		t.Errorf("ForkboxErr = %v, want nil (only a peer failed)", rep.ForkboxErr())
	}

	// On other storage the btrfs targets become a note.
	over := &Report{Storage: "overlay", Results: []Result{{Operation: OpSnapshot, System: SystemForkbox, N: 1, P50MS: 20, P99MS: 20, MeanMS: 20}}}
	over.finish()
	if r := over.Results[0]; r.Target != nil || !strings.Contains(r.Note, "is for btrfs (storage: overlay)") {
		t.Errorf("overlay snapshot = %+v, want no target and a note", r)
	}
}
