// Package daemontest starts a real forkbox daemon (package daemon, real
// runc sandboxes with the real agent, real SQLite) for the tests of the
// packages built on its API: the Go client and the CLI. The e2e package
// keeps its own shared daemon; this one is per test binary or per test.
//
// A daemon needs root and runc. Without them Start skips the test and says
// why, except under CI (CI=1), where it fails the test instead.
package daemontest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
)

// Daemon is a running test daemon.
type Daemon struct {
	// URL is the API's base URL (a port on 127.0.0.1 picked by the kernel).
	URL string
	// Key is the admin API key of the "default" tenant.
	Key string
	// Client is a client of URL with Key.
	Client *client.Client
	// DataDir is the daemon's data directory (under a temporary directory
	// the sandbox uids can traverse).
	DataDir string
	// AgentPath is the forkbox-agent binary the daemon runs in sandboxes.
	AgentPath string
}

// Start starts a daemon on a fresh data directory with a 2 GiB storage
// image of the driver FORKBOX_STORAGE names (default: btrfs where it
// works), running the agent FORKBOX_AGENT names or one built from this
// module. When t ends every session is destroyed, the daemon stops and
// releases the host (daemon.Down: sandboxes, nftables table, cgroups,
// storage mount and loop device) and the directory is removed. Start
// skips t when the host cannot run sandboxes (fails it under CI) and
// fails it when the daemon does not start.
func Start(t testing.TB) *Daemon {
	t.Helper()
	if why := cannotRun(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("daemontest: %s (CI is set, so this is a failure)", why)
		}
		t.Skipf("daemontest: %s", why)
	}
	tmp, err := os.MkdirTemp("", "forkbox-daemontest-")
	if err != nil {
		t.Fatal(err)
	}
	// Sandbox processes run as unprivileged host ids and must traverse here.
	if err := os.Chmod(tmp, 0o711); err != nil {
		os.RemoveAll(tmp)
		t.Fatal(err)
	}
	dataDir := filepath.Join(tmp, "data")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var d *daemon.Daemon
	t.Cleanup(func() { stop(t, d, tmp, dataDir, log) })
	agent := os.Getenv("FORKBOX_AGENT")
	if agent == "" {
		if agent, err = BuildAgent(filepath.Join(tmp, "bin")); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err = daemon.Start(ctx, daemon.Options{
		DataDir: dataDir, Listen: "127.0.0.1:0", AgentPath: agent, Log: log,
		Storage: os.Getenv("FORKBOX_STORAGE"), StorageImageBytes: 2 << 30, StopSessions: true,
	})
	if err != nil {
		t.Fatalf("daemontest: start the daemon: %v", err)
	}
	b, err := os.ReadFile(d.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(string(b))
	return &Daemon{URL: d.URL, Key: key, Client: client.New(d.URL, key, nil), DataDir: dataDir, AgentPath: agent}
}

// cannotRun says why this host cannot run sandboxes ("" when it can).
func cannotRun() string {
	if os.Geteuid() != 0 {
		return "needs root (sandboxes use namespaces, cgroups and mounts)"
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return "needs runc in PATH (make deps installs it)"
	}
	return ""
}

// BuildAgent builds forkbox-agent (static, as make build does) into dir
// and returns its path; the error carries the compiler's output.
func BuildAgent(dir string) (string, error) {
	return build(dir, "forkbox-agent")
}

// BuildCLI builds the forkbox binary into dir and returns its path; the
// error carries the compiler's output.
func BuildCLI(dir string) (string, error) {
	return build(dir, "forkbox")
}

func build(dir, name string) (string, error) {
	cmd := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "github.com/forkbox/forkbox/cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v: %s", name, err, out)
	}
	return filepath.Join(dir, name), nil
}

// stop destroys d's sessions (pool members go with the daemon), stops d
// (nil when it did not start), takes down what is left of dataDir on the
// host and removes tmp.
func stop(t testing.TB, d *daemon.Daemon, tmp, dataDir string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if d != nil {
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("daemontest: stop the daemon: %v", err)
		}
	}
	if _, err := os.Stat(dataDir); err == nil {
		if _, err := daemon.Down(ctx, daemon.DownOptions{DataDir: dataDir, Log: log}); err != nil {
			t.Errorf("daemontest: take down %s: %v", dataDir, err)
		}
	}
	os.RemoveAll(datadir.Layout{Root: dataDir}.Scratch())
	os.RemoveAll(tmp)
}
