// Package e2e tests forkbox end to end: a real daemon (in-process), real
// runc sandboxes with the real agent, real SQLite, driven through the Go
// client exactly as users drive it. The tests need root and runc; without
// them every test skips and says why.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/node"
)

// env is the shared daemon of the package's tests.
var env struct {
	skip    string // why tests cannot run, if they cannot
	agent   string // path of the forkbox-agent binary
	cli     string // path of the forkbox binary
	dataDir string
	d       *daemon.Daemon
	c       *client.Client
	key     string
}

func TestMain(m *testing.M) {
	code := func() int {
		if err := setup(); err != nil {
			env.skip = err.Error()
			fmt.Fprintln(os.Stderr, "e2e: tests will skip:", env.skip)
			return m.Run()
		}
		defer teardown()
		code := m.Run()
		if forwardMode && code == 0 {
			if err := forwarded.checkForwarded(); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: the second Node:", err)
				return 1
			}
		}
		if spareMode > 0 && code == 0 {
			if err := checkSparesUsed(); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: spares:", err)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// setup builds the binaries (unless FORKBOX_AGENT/FORKBOX_BIN name them)
// and starts a daemon on a fresh data directory.
func setup() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (sandboxes use namespaces, cgroups and mounts)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return fmt.Errorf("needs runc in PATH (make deps installs it)")
	}
	tmp, err := os.MkdirTemp("", "forkbox-e2e-")
	if err != nil {
		return err
	}
	// Sandbox processes run as unprivileged host ids and must traverse here.
	if err := os.Chmod(tmp, 0o711); err != nil {
		return err
	}
	env.dataDir = filepath.Join(tmp, "data")
	env.agent = os.Getenv("FORKBOX_AGENT")
	env.cli = os.Getenv("FORKBOX_BIN")
	if env.agent == "" || env.cli == "" {
		bin := filepath.Join(tmp, "bin")
		cmd := exec.Command("go", "build", "-o", bin+"/", "../cmd/forkbox", "../cmd/forkbox-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build binaries: %v: %s", err, out)
		}
		env.agent, env.cli = filepath.Join(bin, "forkbox-agent"), filepath.Join(bin, "forkbox")
	}
	d, err := startDaemon(env.dataDir)
	if err != nil {
		return err
	}
	env.d = d
	b, err := os.ReadFile(d.KeyFile)
	if err != nil {
		return err
	}
	env.key = strings.TrimSpace(string(b))
	env.c = client.New(d.URL, env.key, nil)
	return nil
}

func startDaemon(dataDir string) (*daemon.Daemon, error) { return startDaemonWith(dataDir, nil) }

// startDaemonWith is startDaemon with the test options changed by tune
// (when not nil) before the daemon starts.
func startDaemonWith(dataDir string, tune func(*daemon.Options)) (*daemon.Daemon, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := daemon.Options{
		DataDir: dataDir, Listen: "127.0.0.1:0", AgentPath: env.agent, Log: log, Domain: e2eDomain,
		Storage: os.Getenv("FORKBOX_STORAGE"), StorageImageBytes: 4 << 30, Limits: testLimits(),
		EgressResolver: egressNames, EgressTestNetworks: egressTestNetworks,
		// Small enough that one session can be over it (TestTenantPolicyErrors),
		// large enough for every other test's sessions at once.
		Capacity: admission.Capacity{MaxMemoryMB: 48 << 10},
		// Tenants' pulls may reach the tests' registries by this name
		// (not by 127.0.0.1: TestTemplatePullTenant).
		PrivateRegistries: []string{"localhost"},
	}
	if forwardMode && dataDir == env.dataDir {
		opts.WrapNode = newForwardNode
	}
	if dataDir == env.dataDir {
		opts.Spares = spareMode
	}
	_, ca, err := brokerUpstreamCA()
	if err != nil {
		return nil, err
	}
	opts.BrokerUpstreamCA = ca
	if tune != nil {
		tune(&opts)
	}
	return daemon.Start(context.Background(), opts)
}

// testLimits are the daemon's default limits with a small default disk:
// the overlay driver on a kernel without project quotas reserves a
// session's whole disk limit in the test's 4 GiB volume.
func testLimits() node.Limits {
	l := defaults.Limits()
	l.DefaultDiskMB = 256
	return l
}

func teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ss, err := env.c.ListSessions(ctx, client.ListOptions{}); err == nil {
		for _, s := range ss {
			_ = env.c.DeleteSession(ctx, s.ID)
		}
	}
	_ = env.d.Shutdown(ctx)
	downDataDir(env.dataDir)
	os.RemoveAll(datadir.Layout{Root: env.dataDir}.Scratch())
	os.RemoveAll(filepath.Dir(env.dataDir))
}

// downDataDir takes down what a test daemon on dataDir left on the host
// once it has stopped (forkbox down): sandboxes, its nftables table and
// cgroup parent, its storage mount and loop device.
func downDataDir(dataDir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if _, err := daemon.Down(ctx, daemon.DownOptions{DataDir: dataDir, Log: log}); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: take down", dataDir+":", err)
	}
}

// need skips t when the environment cannot run sandboxes, or fails it
// under CI (CI=1), which must run every test it can: a daemon that did
// not start there is a failure, not a reason to skip.
func need(t *testing.T) {
	t.Helper()
	if env.skip != "" {
		if os.Getenv("CI") != "" {
			t.Fatal("e2e: " + env.skip + " (CI is set, so this is a failure)")
		}
		t.Skip("e2e: " + env.skip)
	}
}

// ctxFor returns a context that bounds one test step (a hang guard, not a
// performance assertion).
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newSession creates a session and destroys it when the test ends.
func newSession(t *testing.T, req client.CreateRequest) *client.Session {
	t.Helper()
	need(t)
	s, _, err := env.c.CreateSession(ctxFor(t, time.Minute), req, "")
	if err != nil {
		t.Fatalf("create session: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = env.c.DeleteSession(ctx, s.ID)
	})
	return s
}

// run execs argv in session id and returns its result with stdout and stderr.
func run(t *testing.T, id string, req client.ExecRequest) (*client.ExecResult, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	res, err := env.c.Exec(ctxFor(t, 2*time.Minute), id, req, &stdout, &stderr)
	if err != nil {
		t.Fatalf("exec %v %q: %v", req.Argv, truncate(req.Cmd, 80), err)
	}
	return res, stdout.String(), stderr.String()
}

// sh runs a shell command as the session's default user and fails the
// test unless it exits 0; it returns stdout.
func sh(t *testing.T, id, cmd string) string {
	t.Helper()
	res, out, errOut := run(t, id, client.ExecRequest{Cmd: cmd})
	if res.ExitCode != 0 {
		t.Fatalf("%q exited %d; stdout %q stderr %q", cmd, res.ExitCode, out, errOut)
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// download reads a sandbox file completely.
func download(t *testing.T, id, path, user string) []byte {
	t.Helper()
	rc, err := env.c.Download(ctxFor(t, time.Minute), id, path, user)
	if err != nil {
		t.Fatalf("download %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return b
}
