package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestDestroyLeavesNothing proves DELETE removes processes, cgroups, runc
// state, mounts and the writable layer, and later calls get 410.
func TestDestroyLeavesNothing(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ctx := ctxFor(t, time.Minute)
	sh(t, s.ID, "echo data > /home/user/f; sleep 600 >/dev/null 2>&1 &")
	if err := env.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, env.dataDir, s.ID)
	got, err := env.c.GetSession(ctx, s.ID)
	if err != nil || got.State != "terminated" || got.Reason != "deleted" || got.EndedAt == nil {
		t.Fatalf("after delete: %+v %v", got, err)
	}
	_, err = env.c.Exec(ctx, s.ID, client.ExecRequest{Argv: []string{"true"}}, nil, nil)
	if !errors.Is(err, errdefs.ErrTerminated) {
		t.Fatalf("exec on a deleted session: %v, want 410", err)
	}
	if err := env.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatalf("second delete: %v, want no-op", err)
	}
}

// TestSessionTimeout proves the daemon ends a session at its timeout
// (reason timeout) and cleans it up, and SetTimeout moves the deadline.
func TestSessionTimeout(t *testing.T) {
	s := newSession(t, client.CreateRequest{TimeoutS: 2})
	ctx := ctxFor(t, time.Minute)
	ext := newSession(t, client.CreateRequest{TimeoutS: 2})
	if _, err := env.c.SetTimeout(ctx, ext.ID, 120); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		got, err := env.c.GetSession(ctx, s.ID)
		return err == nil && got.State == "terminated"
	})
	got, _ := env.c.GetSession(ctx, s.ID)
	if got.Reason != "timeout" {
		t.Fatalf("ended with reason %q, want timeout", got.Reason)
	}
	assertGone(t, env.dataDir, s.ID)
	if got, _ := env.c.GetSession(ctx, ext.ID); got.State != "running" {
		t.Fatalf("extended session is %s", got.State)
	}
	if _, err := env.c.SetTimeout(ctx, ext.ID, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("timeout 0: %v", err)
	}
}

// TestUsage proves usage reports CPU, memory, pids and disk from outside.
func TestUsage(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	// sync: disk bytes count data once it is written out (btrfs accounts
	// delayed allocations when they reach the disk).
	sh(t, s.ID, "head -c 5000000 /dev/urandom > /home/user/blob; sync; python3 -c 'sum(range(3*10**6))'")
	u, err := env.c.Usage(ctxFor(t, time.Minute), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if u.CPUSeconds <= 0 || u.MemoryPeakBytes <= 0 || u.Pids < 1 || u.DiskBytes < 5000000 {
		t.Fatalf("usage %+v", u)
	}
}

// TestDaemonRestart proves a restarted daemon adopts live sandboxes, cleans
// up ones that died while it was down, and removes orphans.
func TestDaemonRestart(t *testing.T) {
	need(t)
	tmp, err := os.MkdirTemp("", "forkbox-restart-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o711)
	dataDir := filepath.Join(tmp, "data")
	defer func() {
		downDataDir(dataDir)
		os.RemoveAll(tmp)
	}()
	d1, err := startDaemon(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(d1.KeyFile)
	c1 := client.New(d1.URL, strings.TrimSpace(string(key)), nil)
	ctx := ctxFor(t, 2*time.Minute)
	alive, _, err := c1.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	doomed, _, err := c1.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Exec(ctx, alive.ID, client.ExecRequest{Cmd: "echo kept > /home/user/state"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d1.Shutdown(shutdownCtx); err != nil {
		t.Fatal(err)
	}
	// While the daemon is down: one sandbox dies, an orphan directory appears.
	if out, err := exec.Command("runc", "--root", filepath.Join(dataDir, "runc"), "kill", doomed.ID, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v %s", err, out)
	}
	orphan := filepath.Join(dataDir, "sandboxes", "orphan0000000000000")
	os.MkdirAll(orphan, 0o711)
	waitFor(t, func() bool {
		out, _ := exec.Command("runc", "--root", filepath.Join(dataDir, "runc"), "state", doomed.ID).CombinedOutput()
		return strings.Contains(string(out), `"stopped"`)
	})

	d2, err := startDaemon(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = client.New(d2.URL, strings.TrimSpace(string(key)), nil).DeleteSession(context.Background(), alive.ID)
		d2.Shutdown(context.Background())
	}()
	c2 := client.New(d2.URL, strings.TrimSpace(string(key)), nil)
	var out strings.Builder
	res, err := c2.Exec(ctx, alive.ID, client.ExecRequest{Argv: []string{"cat", "/home/user/state"}}, &out, nil)
	if err != nil || res.ExitCode != 0 || out.String() != "kept\n" {
		t.Fatalf("adopted sandbox: %v %+v %q", err, res, out.String())
	}
	got, err := c2.GetSession(ctx, doomed.ID)
	if err != nil || got.State != "terminated" || got.Reason != "error" {
		t.Fatalf("dead sandbox after restart: %+v %v", got, err)
	}
	assertGone(t, dataDir, doomed.ID)
	if _, err := os.Stat(orphan); err == nil {
		t.Fatal("orphaned sandbox directory was not removed")
	}
}

// TestSandboxDeathIsNoticed proves that when a sandbox's init dies (killed
// from the host here), the next call ends the session with reason error and
// cleans up, instead of failing forever.
func TestSandboxDeathIsNoticed(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	b, err := os.ReadFile(filepath.Join(env.dataDir, "sandboxes", s.ID, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("kill", "-9", strings.TrimSpace(string(b))).CombinedOutput(); err != nil {
		t.Fatalf("kill init: %v %s", err, out)
	}
	ctx := ctxFor(t, time.Minute)
	var err2 error
	waitFor(t, func() bool {
		_, err2 = env.c.Exec(ctx, s.ID, client.ExecRequest{Argv: []string{"true"}}, nil, nil)
		return errors.Is(err2, errdefs.ErrTerminated)
	})
	got, _ := env.c.GetSession(ctx, s.ID)
	if got.State != "terminated" || got.Reason != "error" {
		t.Fatalf("after init death: %+v", got)
	}
	assertGone(t, env.dataDir, s.ID)
}

// TestAgentReapsAndForwardsSignals proves the agent, as init, reaps
// orphaned processes (no zombies pile up) and forwards SIGTERM sent to the
// sandbox's init to the process groups it started.
func TestAgentReapsAndForwardsSignals(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	// Orphans: the shell exits at once, its children are reparented to pid 1.
	sh(t, s.ID, "for i in 1 2 3 4 5; do (sleep 0.1 &) ; done")
	waitFor(t, func() bool {
		out := sh(t, s.ID, "ps -eo stat= | grep -c '^Z' || true")
		return strings.TrimSpace(out) == "0"
	})
	ctx := ctxFor(t, time.Minute)
	if _, err := env.c.ExecBackground(ctx, s.ID, client.ExecRequest{
		Cmd: `trap 'echo forwarded > /tmp/term; exit 0' TERM; echo > /tmp/ready; while true; do sleep 0.05; done`}); err != nil {
		t.Fatal(err)
	}
	upper := hostPath(t, env.dataDir, s.ID, "tmp")
	waitFor(t, func() bool { _, err := os.Stat(filepath.Join(upper, "ready")); return err == nil })
	b, err := os.ReadFile(filepath.Join(env.dataDir, "sandboxes", s.ID, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("kill", "-TERM", strings.TrimSpace(string(b))).CombinedOutput(); err != nil {
		t.Fatalf("kill -TERM init: %v %s", err, out)
	}
	marker := filepath.Join(upper, "term")
	waitFor(t, func() bool {
		got, err := os.ReadFile(marker)
		return err == nil && string(got) == "forwarded\n"
	})
}
