// Package drivertest is the conformance suite every isolation driver must
// pass (runc today; gVisor and microVM drivers next). It drives the
// runtime.Driver interface directly against real sandboxes: a base template
// root filesystem and the real forkbox-agent as init.
//
// A driver's test calls Run with a factory; the suite skips (saying why)
// when it cannot run here: not root, or no agent binary (set FORKBOX_AGENT,
// as `make test` does).
package drivertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
	"github.com/forkbox/forkbox/internal/envdpb/processpb/processpbconnect"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
)

// Factory returns a driver whose state lives under stateRoot.
type Factory func(t *testing.T, stateRoot string) runtime.Driver

// env is what one suite run shares.
type env struct {
	driver runtime.Driver
	dir    string // 0711 scratch directory
	agent  string
	n      int
}

// Run runs every conformance test against the driver made by newDriver.
func Run(t *testing.T, newDriver Factory) {
	if os.Geteuid() != 0 {
		t.Skip("driver conformance needs root (namespaces, cgroups, mounts)")
	}
	agentPath := os.Getenv("FORKBOX_AGENT")
	if agentPath == "" {
		t.Skip("set FORKBOX_AGENT to the forkbox-agent binary (make test does)")
	}
	dir, err := os.MkdirTemp("", "forkbox-drivertest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	e := &env{dir: dir, agent: agentPath}
	e.driver = newDriver(t, filepath.Join(dir, "state"))
	t.Run("Lifecycle", e.testLifecycle)
	t.Run("Limits", e.testLimits)
	t.Run("KillProcessGroup", e.testKillProcessGroup)
	t.Run("Pause", e.testPause)
	t.Run("PauseDuringKill", e.testPauseDuringKill)
	t.Run("BadConfig", e.testBadConfig)
	t.Run("Sample", e.testSample)
	if e.driver.Capabilities().JoinUserNamespace {
		t.Run("JoinUserNamespace", e.testJoinUserNamespace)
	}
}

// sandbox is one running test sandbox.
type sandbox struct {
	id      string
	dir     string
	process processpbconnect.ProcessClient
}

// start creates a sandbox with limits and waits until its agent answers.
func (e *env) start(t *testing.T, limits runtime.Limits) *sandbox {
	t.Helper()
	return e.startWith(t, limits, nil)
}

// startWith is start with a last change to the sandbox's config (when
// not nil), given the sandbox's state directory.
func (e *env) startWith(t *testing.T, limits runtime.Limits, change func(cfg *runtime.Config)) *sandbox {
	t.Helper()
	e.n++
	id := fmt.Sprintf("dt%d%d", time.Now().UnixNano()%1e9, e.n)
	dir := filepath.Join(e.dir, id)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	// A private base template is the sandbox's whole root filesystem (the
	// storage drivers have their own suite; this one needs only a root).
	tplDir := filepath.Join(dir, "base")
	tpl, err := storage.BuildBase(tplDir, storage.DefaultIDShift)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := storage.RootFS(tplDir)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.driver.Delete(ctx, id); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
	})
	sock := filepath.Join(dir, "agent.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	defer ul.Close()
	lf, err := ul.File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	cfg, _ := json.Marshal(wire.Config{DefaultUser: "user"})
	shift := storage.DefaultIDShift
	mounts := append([]runtime.Mount(nil), tpl.HostMounts...)
	mounts = append(mounts, runtime.Mount{Source: filepath.Join(rootfs, "home/user"), Target: "/home/user"})
	rcfg := runtime.Config{
		ID: id, StateDir: dir, RootFS: rootfs, Mounts: mounts, Limits: limits,
		AgentPath: e.agent, AgentEnv: []string{wire.ConfigEnv + "=" + string(cfg)}, AgentListener: lf,
		UIDMap: []runtime.IDMap{{ContainerID: 0, HostID: shift.UIDBase, Size: shift.Size}},
		GIDMap: []runtime.IDMap{{ContainerID: 0, HostID: shift.GIDBase, Size: shift.Size}},
	}
	if change != nil {
		change(&rcfg)
	}
	err = e.driver.Create(context.Background(), rcfg)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	sb := &sandbox{id: id, dir: dir, process: processpbconnect.NewProcessClient(hc, "http://agent")}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := hc.Get("http://agent/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never answered: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return sb
}

var defaultLimits = runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, Pids: 128}

// run executes argv in sb through the agent and returns its end event and
// output; a failed start or a broken stream fails the test.
func (sb *sandbox) run(t *testing.T, ctx context.Context, argv ...string) (*processpb.ProcessEvent_EndEvent, string, uint32) {
	t.Helper()
	end, out, pid, err := sb.tryRun(ctx, argv...)
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	return end, out, pid
}

// tryRun is run returning the error instead; end is nil when the stream
// ended without an end event.
func (sb *sandbox) tryRun(ctx context.Context, argv ...string) (*processpb.ProcessEvent_EndEvent, string, uint32, error) {
	f := false
	st, err := sb.process.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: argv[0], Args: argv[1:]}, Stdin: &f}))
	if err != nil {
		return nil, "", 0, fmt.Errorf("start: %w", err)
	}
	defer st.Close()
	var out strings.Builder
	var pid uint32
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if s := ev.GetStart(); s != nil {
			pid = s.GetPid()
		}
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return end, out.String(), pid, nil
		}
	}
	if err := st.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return nil, out.String(), pid, fmt.Errorf("stream: %w", err)
	}
	return nil, out.String(), pid, nil
}

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
	if after.CPUSeconds < before.CPUSeconds+0.4 || after.Pids < 1 || after.ReadAt.IsZero() {
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

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
