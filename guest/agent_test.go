package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/guest/wire"
	"golang.org/x/sys/unix"
)

// The tests of this package run the real forkbox-agent binary as a host
// process serving its own Unix socket (wire.ListenEnv), the way the
// gVisor tier runs it, and talk to it through a Client.

// hangGuard bounds every call of a test so that a bug fails it instead of
// hanging the run. It is not a performance assertion.
const hangGuard = 30 * time.Second

// execAgentEnv, set in the environment of this test binary, makes it drop
// CAP_SYS_ADMIN from its capability bounding set and exec the agent binary
// it names: the agent refuses to start with it there (a runtime never
// leaves it), and a test runs as root with the full set.
const execAgentEnv = "GUEST_TEST_EXEC_AGENT"

func TestMain(m *testing.M) {
	if bin := os.Getenv(execAgentEnv); bin != "" {
		os.Exit(execAgent(bin))
	}
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// execAgent is the agent's launcher (the bounding set is a thread's, so
// the drop and the exec happen on one locked thread).
func execAgent(bin string) int {
	goruntime.LockOSThread()
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "drop CAP_SYS_ADMIN from the bounding set:", err)
		return 2
	}
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if len(kv) < len(execAgentEnv)+1 || kv[:len(execAgentEnv)+1] != execAgentEnv+"=" {
			env = append(env, kv)
		}
	}
	err := syscall.Exec(bin, []string{bin}, env)
	fmt.Fprintln(os.Stderr, "exec the agent:", err)
	return 2
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// agentBinary returns the forkbox-agent binary: FORKBOX_AGENT, else one
// built from this module once per test run (with go from PATH).
func agentBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FORKBOX_AGENT"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "guest-agent-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "forkbox-agent")
		gobin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("set FORKBOX_AGENT to the forkbox-agent binary, or put go on PATH to build it: %v", err)
			return
		}
		cmd := exec.Command(gobin, "build", "-o", builtBin, "../cmd/forkbox-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build the agent: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// testAgent is a running agent process.
type testAgent struct {
	dir     string // a directory of the test's, for files
	socket  string
	control string // its checkpoint control file
	log     *syncBuffer
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startAgent starts the agent (default user root, working directory a
// fresh directory) and returns it once its socket accepts a Client's
// health check. When t ends it is stopped (SIGTERM, then SIGKILL) and
// waited for; its log is shown when t failed.
func startAgent(t *testing.T) (*testAgent, *Client) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agent switches users and owns files for them: run as root")
	}
	bin := agentBinary(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a := &testAgent{dir: dir, socket: filepath.Join(dir, "agent.sock"), control: filepath.Join(dir, "resume.json"), log: new(syncBuffer)}
	cfg, _ := json.Marshal(wire.Config{DefaultUser: "root", Workdir: dir})
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), execAgentEnv+"="+bin, wire.ListenEnv+"="+a.socket,
		wire.ControlEnv+"="+a.control, wire.ConfigEnv+"="+string(cfg))
	cmd.Stdout, cmd.Stderr = a.log, a.log
	// Its own process group: the processes it starts are its children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", a.log)
		}
	})
	c := New(a.socket)
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("agent not ready: %v\n%s", err, a.log)
	}
	return a, c
}

// guard returns a context bounded by hangGuard for one test.
func guard(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return ctx
}
