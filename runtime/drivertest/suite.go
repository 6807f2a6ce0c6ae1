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
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

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
	t.Run("StatsRepeated", e.testStatsRepeated)
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
