package drivertest

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
)

// testLifecycle: Create runs the agent; Status, List and Stats see the
// sandbox; Delete removes it and its cgroups; deleting again is fine.
func (e *env) testLifecycle(t *testing.T) {
	sb := e.start(t, defaultLimits)
	ctx := context.Background()
	if st, err := e.driver.Status(ctx, sb.id); err != nil || st != runtime.StatusRunning {
		t.Fatalf("status %q %v, want running", st, err)
	}
	ids, err := e.driver.List(ctx)
	if err != nil || !contains(ids, sb.id) {
		t.Fatalf("list %v %v does not have %s", ids, err, sb.id)
	}
	end, out, _ := sb.run(t, ctx, "sh", "-c", "hostname; id -u")
	if end.GetExitCode() != 0 || out != sb.id+"\n1000\n" {
		t.Fatalf("exec in sandbox: %+v %q", end, out)
	}
	stats, err := e.driver.Stats(ctx, sb.id)
	if err != nil || stats.Pids < 1 || stats.MemoryBytes <= 0 || stats.CPUSeconds <= 0 {
		t.Fatalf("stats %+v %v", stats, err)
	}
	if err := e.driver.Delete(ctx, sb.id); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.driver.Status(ctx, sb.id); st != runtime.StatusUnknown {
		t.Fatalf("status after delete %q, want unknown", st)
	}
	if ids, err := e.driver.List(ctx); err != nil || contains(ids, sb.id) {
		t.Fatalf("list after delete %v %v still has %s", ids, err, sb.id)
	}
	if _, err := e.driver.Stats(ctx, sb.id); err == nil {
		t.Fatal("stats of a deleted sandbox succeeded")
	}
	if err := e.driver.Delete(ctx, sb.id); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/*/" + sb.id); len(left) > 0 {
		t.Fatalf("cgroups left after delete: %v", left)
	}
}

// testLimits: the limits in Config reach the host kernel (CPU quota in the
// sandbox's cgroup), the pids limit refuses a fork loop's forks and the
// sandbox carries on (for gVisor the limit is the Sentry's, inside), and
// an allocation beyond memory is OOM-killed: the process when the driver
// kills processes, the whole sandbox when it declares SandboxOOM.
func (e *env) testLimits(t *testing.T) {
	sb := e.start(t, runtime.Limits{CPU: 0.5, MemoryBytes: 256 << 20, Pids: 50})
	ctx := context.Background()
	if q := readCgroup(t, "cpu", sb.id, "cpu.cfs_quota_us"); q != "50000" {
		t.Fatalf("cpu.cfs_quota_us %q, want 50000", q)
	}
	end, out, _, err := sb.tryRun(ctx, "python3", "-c", forkLoop)
	if err != nil {
		t.Fatalf("fork loop broke the sandbox: %v", err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); !end.GetExited() || n < 1 || n > 50 {
		t.Fatalf("fork loop under a pids limit of 50: %+v, %q processes forked", end, out)
	}
	if _, out, _ := sb.run(t, ctx, "echo", "alive"); out != "alive\n" {
		t.Fatalf("after the fork loop: %q", out)
	}
	sb = e.start(t, runtime.Limits{CPU: 1, MemoryBytes: 64 << 20, Pids: 50})
	end, _, _, _ = sb.tryRun(ctx, "python3", "-c", "b = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1")
	if e.driver.Capabilities().SandboxOOM {
		if end != nil && end.GetExited() && end.GetExitCode() == 0 {
			t.Fatalf("allocation beyond the limit succeeded: %+v", end)
		}
		waitFor(t, func() bool {
			st, _ := e.driver.Status(ctx, sb.id)
			return st == runtime.StatusStopped || st == runtime.StatusUnknown
		})
		return
	}
	if end.GetExited() || !strings.Contains(end.GetStatus(), "killed") {
		t.Fatalf("allocation beyond the limit ended %+v, want killed", end)
	}
	stats, err := e.driver.Stats(ctx, sb.id)
	if err != nil || stats.OOMKills < 1 || stats.MemoryPeakBytes > 65<<20 {
		t.Fatalf("stats after OOM %+v %v", stats, err)
	}
	if c, ok := e.driver.(runtime.OOMCounter); ok {
		if n, err := c.OOMKills(ctx, sb.id); err != nil || n != stats.OOMKills {
			t.Fatalf("OOMKills after OOM: %d, %v; Stats counted %d", n, err, stats.OOMKills)
		}
		if _, err := c.OOMKills(ctx, "no-such-sandbox"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("OOMKills of an unknown sandbox: %v, want ErrNotFound", err)
		}
	}
	if m := readCgroup(t, "memory", sb.id, "memory.limit_in_bytes"); m != strconv.Itoa(64<<20) {
		t.Fatalf("memory.limit_in_bytes %q", m)
	}
}

// testSample: a driver with a cheap reading for the host monitor
// (runtime.Sampler) sees the sandbox's CPU grow while it works, its tasks
// and their limit, and no sandbox once it is deleted. It reports what a
// Sample and a Stats cost here (the monitor takes one of every sandbox
// every 5 s).
func (e *env) testSample(t *testing.T) {
	s, ok := e.driver.(runtime.Sampler)
	if !ok {
		t.Skip("the driver has no runtime.Sampler; the monitor uses Stats")
	}
	sb := e.start(t, defaultLimits)
	ctx := context.Background()
	before, err := s.Sample(ctx, sb.id)
	if err != nil {
		t.Fatal(err)
	}
	// Half a second of CPU, however busy the host is.
	sb.run(t, ctx, "python3", "-c", "import time\nwhile time.process_time() < 0.5: pass")
	after, err := s.Sample(ctx, sb.id)
	if err != nil {
		t.Fatal(err)
	}
	// Half, not all of it: under gVisor the guest's clock and the host
	// cgroup's charge differ (CI saw 0.37 s charged for 0.5 s of guest
	// CPU), and an idle sandbox is charged nowhere near 0.25 s.
	if after.CPUSeconds < before.CPUSeconds+0.25 || after.Pids < 1 || after.ReadAt.IsZero() {
		t.Fatalf("samples around half a second of CPU: %+v then %+v", before, after)
	}
	if limit := after.PidsLimit; limit != 0 && limit < defaultLimits.Pids {
		t.Fatalf("pids limit %d, below the sandbox's %d", limit, defaultLimits.Pids)
	}
	const n = 20
	cost := func(read func() error) (time.Duration, int) {
		start, failed := time.Now(), 0
		for i := 0; i < n; i++ {
			if err := read(); err != nil {
				failed++
			}
		}
		return time.Since(start) / n, failed
	}
	sampleCost, sampleFailed := cost(func() error { _, err := s.Sample(ctx, sb.id); return err })
	statsCost, statsFailed := cost(func() error { _, err := e.driver.Stats(ctx, sb.id); return err })
	t.Logf("%s: Sample %v, Stats %v per call (mean of %d; %d and %d failed)", e.driver.Name(),
		sampleCost, statsCost, n, sampleFailed, statsFailed)
	if sampleFailed > 0 {
		t.Fatalf("%d of %d samples failed", sampleFailed, n)
	}
	if err := e.driver.Delete(ctx, sb.id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(ctx, sb.id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("sample of a deleted sandbox: %v, want not found", err)
	}
}

// readCgroup reads a file of the sandbox's cgroup (cgroup v1,
// PARENT/ID, whatever parent the driver uses).
func readCgroup(t *testing.T, controller, id, file string) string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", controller, "*", id))
	if len(dirs) != 1 {
		t.Fatalf("cgroup of %s in %s: %v", id, controller, dirs)
	}
	b, err := os.ReadFile(filepath.Join(dirs[0], file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// testBadConfig: invalid ids and a missing root filesystem fail, leaving
// nothing behind.
func (e *env) testBadConfig(t *testing.T) {
	ctx := context.Background()
	if err := e.driver.Create(ctx, runtime.Config{ID: "../etc"}); err == nil {
		t.Fatal("create with a path-like id succeeded")
	}
	dir := filepath.Join(e.dir, "bad")
	os.MkdirAll(dir, 0o711)
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	lf, _ := ul.File()
	defer lf.Close()
	err = e.driver.Create(ctx, runtime.Config{ID: "badrootfs1", StateDir: dir, RootFS: filepath.Join(dir, "nope"),
		Limits: defaultLimits, AgentPath: e.agent, AgentListener: lf})
	if err == nil {
		t.Fatal("create with a missing rootfs succeeded")
	}
	if st, _ := e.driver.Status(ctx, "badrootfs1"); st != runtime.StatusUnknown {
		t.Fatalf("failed create left a sandbox in state %q", st)
	}
}
