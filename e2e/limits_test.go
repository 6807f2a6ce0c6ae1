package e2e

import (
	"strconv"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/client"
)

// TestMemoryHogIsOOMKilled proves a process allocating beyond the memory
// limit is killed by the kernel, reported as oom_killed with exit code 137,
// and the sandbox keeps answering.
func TestMemoryHogIsOOMKilled(t *testing.T) {
	s := newSession(t, client.CreateRequest{MemoryMB: 128})
	res, _, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"python3", "-c",
		"b = bytearray(512 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"}})
	if !res.OOMKilled || res.ExitCode != 137 || res.Signal != 9 {
		t.Fatalf("memory hog result %+v, want oom_killed with exit 137", res)
	}
	if got := strings.TrimSpace(sh(t, s.ID, "echo alive")); got != "alive" {
		t.Fatalf("sandbox does not answer after the OOM kill: %q", got)
	}
	u, err := env.c.Usage(ctxFor(t, 30e9), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if u.OOMKills < 1 || u.MemoryPeakBytes > 129<<20 {
		t.Fatalf("usage after OOM: %+v (peak must stay within 128 MiB)", u)
	}
}

// TestForkBombHitsPidsLimit proves a fork bomb is contained by the pids
// limit, killed at its exec timeout, and the sandbox still answers.
func TestForkBombHitsPidsLimit(t *testing.T) {
	s := newSession(t, client.CreateRequest{Pids: 64})
	res, _, _ := run(t, s.ID, client.ExecRequest{Cmd: "bomb() { bomb | bomb & }; bomb; sleep 30", TimeoutS: 3})
	if !res.TimedOut {
		t.Fatalf("fork bomb result %+v, want timed_out", res)
	}
	if got := strings.TrimSpace(sh(t, s.ID, "echo alive")); got != "alive" {
		t.Fatalf("sandbox does not answer after the fork bomb: %q", got)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(sh(t, s.ID, "ps -e --no-headers | wc -l")))
	if n > 5 {
		t.Fatalf("%d processes left after the fork bomb was killed", n)
	}
	maxPids := readCgroupInt(t, "pids", s.ID, "pids.max")
	if maxPids != 64 {
		t.Fatalf("pids.max = %d, want 64", maxPids)
	}
}

// TestCPUIsThrottled proves a CPU spinner gets no more than its quota: with
// cpu 0.2 a loop that spins for 2 s of wall time accumulates at most about
// 0.2 CPU-seconds per second (checked with generous slack for accounting).
func TestCPUIsThrottled(t *testing.T) {
	s := newSession(t, client.CreateRequest{CPU: 0.2})
	script := `
import os, time
start = time.monotonic()
while time.monotonic() - start < 2.0:
    pass
t = os.times()
print(t.user + t.system, time.monotonic() - start)
`
	out := sh(t, s.ID, "python3 -c '"+script+"'")
	f := strings.Fields(out)
	cpu, _ := strconv.ParseFloat(f[0], 64)
	wall, _ := strconv.ParseFloat(f[1], 64)
	if cpu > 0.35*wall {
		t.Fatalf("spinner used %.2f CPU-s in %.2f s wall; quota is 0.2 cores", cpu, wall)
	}
	if quota := readCgroupInt(t, "cpu", s.ID, "cpu.cfs_quota_us"); quota != 20000 {
		t.Fatalf("cpu.cfs_quota_us = %d, want 20000", quota)
	}
}
