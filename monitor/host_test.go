package monitor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
	"github.com/forkbox/forkbox/internal/envdpb/processpb/processpbconnect"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/cgroupv1"
	"github.com/forkbox/forkbox/runtime/runc"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// testCgroupParent is the cgroup parent of this package's sandboxes.
const testCgroupParent = "forkbox-monitortest"

// host is a minimal lifecycle core for the monitor's tests: real runc
// sandboxes (a base root filesystem, the real agent as init), a real
// store, real admission. It implements Core; End really deletes the
// sandbox and records the reason it was given.
type host struct {
	t      *testing.T
	drv    runtime.Driver
	dir    string
	agent  string
	st     *store.Store
	adm    *admission.Controller
	mu     sync.Mutex
	sbs    map[string]*testSandbox
	ended  chan ending
	checks chan string // ids CheckDead was asked about
	n      int
}

// ending is one End call.
type ending struct {
	id, reason, detail string
}

// testSandbox is one of host's sandboxes.
type testSandbox struct {
	mu      sync.Mutex
	rec     node.Session
	abused  bool
	process processpbconnect.ProcessClient
}

func (sb *testSandbox) ID() string { return sb.Record().ID }
func (sb *testSandbox) Record() node.Session {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec
}
func (sb *testSandbox) ClaimAbuse() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	first := !sb.abused
	sb.abused = true
	return first
}

// newHost returns a host, or skips (saying why) where real sandboxes
// cannot run.
func newHost(t *testing.T) *host {
	t.Helper()
	// Under CI (make test as root) all of these are there: a missing
	// one fails rather than skips.
	skip := t.Skip
	if os.Getenv("CI") != "" {
		skip = t.Fatal
	}
	if os.Geteuid() != 0 {
		skip("real sandboxes need root (namespaces, cgroups, mounts)")
	}
	agentPath := os.Getenv("FORKBOX_AGENT")
	if agentPath == "" {
		skip("set FORKBOX_AGENT to the forkbox-agent binary (make test does)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		skip("runc is not installed (make deps installs it)")
	}
	dir, err := os.MkdirTemp("", "forkbox-monitortest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	drv, err := runc.New(runc.Options{StateRoot: filepath.Join(dir, "state"), CgroupParent: testCgroupParent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cgroupv1.New(testCgroupParent).RemoveParent() })
	st, err := store.Open(context.Background(), filepath.Join(dir, "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &host{t: t, drv: drv, dir: dir, agent: agentPath, st: st,
		adm: admission.New(admission.Options{Store: st}), sbs: map[string]*testSandbox{},
		ended: make(chan ending, 16), checks: make(chan string, 16)}
}

// monitor returns a monitor over h with detector configuration cfg.
func (h *host) monitor(cfg Options) *Monitor {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Core, cfg.Admission, cfg.Store, cfg.Log = h, h.adm, h.st, log
	cfg.Audit = audit.New(h.st, log)
	return New(cfg)
}

// tenant stores tenant name with policy p.
func (h *host) tenant(name string, p tenancy.Policy) {
	h.t.Helper()
	b, _ := json.Marshal(p)
	if err := h.st.CreateTenant(context.Background(), &store.Tenant{Name: name, Policy: string(b), CreatedAt: time.Now()}); err != nil {
		h.t.Fatal(err)
	}
}

// start runs a real sandbox of tenant with limits, records its session
// and waits until its agent answers.
func (h *host) start(tenant string, limits runtime.Limits) *testSandbox {
	t := h.t
	t.Helper()
	h.n++
	id := fmt.Sprintf("mt%d%d", time.Now().UnixNano()%1e9, h.n)
	dir := filepath.Join(h.dir, id)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	tplDir := filepath.Join(dir, "base")
	tpl, err := storage.BuildBase(tplDir, storage.DefaultIDShift)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := storage.RootFS(tplDir)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := h.drv.Delete(ctx, id); err != nil {
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
	err = h.drv.Create(context.Background(), runtime.Config{
		ID: id, StateDir: dir, RootFS: rootfs, Mounts: mounts, Limits: limits,
		AgentPath: h.agent, AgentEnv: []string{wire.ConfigEnv + "=" + string(cfg)}, AgentListener: lf,
		UIDMap: []runtime.IDMap{{ContainerID: 0, HostID: shift.UIDBase, Size: shift.Size}},
		GIDMap: []runtime.IDMap{{ContainerID: 0, HostID: shift.GIDBase, Size: shift.Size}},
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	for deadline := time.Now().Add(30 * time.Second); ; {
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
	now := time.Now().UTC()
	sb := &testSandbox{process: processpbconnect.NewProcessClient(hc, "http://agent"), rec: node.Session{
		ID: id, Template: "base", Driver: h.drv.Name(), State: node.StateRunning, Tenant: tenant,
		CPU: limits.CPU, MemoryMB: limits.MemoryBytes >> 20, Pids: limits.Pids, TimeoutS: 600,
		CreatedAt: now, StartedAt: now, ExpiresAt: now.Add(10 * time.Minute)}}
	if err := h.st.CreateSession(context.Background(), &sb.rec); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.sbs[id] = sb
	h.mu.Unlock()
	return sb
}

// run runs argv in sb to its end and returns its exit code.
func (sb *testSandbox) run(t *testing.T, argv ...string) int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := sb.background(t, ctx, argv...)
	defer st.Close()
	for st.Receive() {
		if end := st.Msg().GetEvent().GetEnd(); end != nil {
			return end.GetExitCode()
		}
	}
	t.Fatalf("%v: no end event: %v", argv, st.Err())
	return -1
}

// background starts argv in sb and returns its event stream, open until
// ctx ends.
func (sb *testSandbox) background(t *testing.T, ctx context.Context, argv ...string) *connect.ServerStreamForClient[processpb.StartResponse] {
	t.Helper()
	f := false
	st, err := sb.process.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: argv[0], Args: argv[1:]}, Stdin: &f}))
	if err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("start %v: no start event: %v", argv, st.Err())
	}
	return st
}

// Running lists the running sandboxes owned by a tenant.
func (h *host) Running() []Sandbox {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Sandbox
	for _, sb := range h.sbs {
		if r := sb.Record(); r.State == node.StateRunning && r.Tenant != "" {
			out = append(out, sb)
		}
	}
	return out
}

// Live lists tenant's running sandboxes (these tests pause none).
func (h *host) Live(tenant string) []Sandbox {
	var out []Sandbox
	for _, sb := range h.Running() {
		if sb.Record().Tenant == tenant {
			out = append(out, sb)
		}
	}
	return out
}

// Driver returns the runc driver.
func (h *host) Driver(Sandbox) runtime.Driver { return h.drv }

// End deletes sb's sandbox, marks it terminated and reports the call.
func (h *host) End(ctx context.Context, s Sandbox, reason, detail string) error {
	sb := s.(*testSandbox)
	err := h.drv.Delete(ctx, sb.ID())
	sb.mu.Lock()
	sb.rec.State, sb.rec.Reason, sb.rec.Detail = node.StateTerminated, reason, detail
	sb.mu.Unlock()
	h.ended <- ending{id: sb.ID(), reason: reason, detail: detail}
	return err
}

// CheckDead reports the id it was asked about.
func (h *host) CheckDead(_ context.Context, id string) error {
	h.checks <- id
	return nil
}

// waitEnded returns the next End call, failing after a generous guard.
func (h *host) waitEnded() ending {
	h.t.Helper()
	select {
	case e := <-h.ended:
		return e
	case <-time.After(2 * time.Minute):
		h.t.Fatal("no session was ended")
		return ending{}
	}
}
