package e2e

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
)

// TestGVisorTeardownAfterRuntimeForgot proves a gVisor teardown finishes
// whatever the runtime still knows: the sandbox's runsc container is
// deleted behind the daemon's back (as when the daemon is killed in the
// middle of a DELETE, after runsc delete), and a DELETE then still removes
// everything (the agent's socket directory, a tmpfs, used to stay mounted
// and the session stayed terminating for ever).
func TestGVisorTeardownAfterRuntimeForgot(t *testing.T) {
	s := gvisorSession(t)
	root := filepath.Join(env.dataDir, "runsc")
	if out, err := exec.Command("runsc", "--root", root, "delete", "--force", s.ID).CombinedOutput(); err != nil {
		t.Fatalf("runsc delete: %v %s", err, out)
	}
	ctx := ctxFor(t, 2*time.Minute)
	if err := env.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatalf("DELETE after the runtime forgot the sandbox: %v", err)
	}
	got, err := env.c.GetSession(ctx, s.ID)
	if err != nil || got.State != "terminated" {
		t.Fatalf("session after DELETE: %+v %v", got, err)
	}
	assertGone(t, env.dataDir, s.ID)
}

// TestGVisorCgoBuiltAgent proves an agent built with cgo (as a plain `go
// build` or `go install` makes it, dynamically linked, where Go refuses
// the all-threads system call the agent once used to drop capabilities)
// starts in the gVisor tier, keeps CAP_SYS_ADMIN for itself (a restored
// clone gets its own hostname) and gives it to nothing it runs.
func TestGVisorCgoBuiltAgent(t *testing.T) {
	needGVisor(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("gcc is not installed; CI must build the cgo agent")
		}
		t.Skip("needs gcc to build the agent with cgo")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "forkbox-agent")
	build := exec.Command("go", "build", "-o", bin, "../cmd/forkbox-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent with cgo: %v %s", err, out)
	}
	if f, err := elf.Open(bin); err != nil || !dynamic(f) {
		t.Fatalf("the agent built with CGO_ENABLED=1 is not dynamically linked (%v): not the case under test", err)
	}
	o := newOwnDaemonWith(t, func(opts *daemon.Options) { opts.AgentPath = bin })
	ctx := ctxFor(t, 3*time.Minute)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Isolation: "gvisor"}, "")
	if err != nil {
		t.Fatalf("gVisor create with a cgo-built agent: %v", err)
	}
	out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{User: "root",
		Cmd: "grep CapBnd /proc/self/status; hostname evil 2>/dev/null; hostname"})
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(out.Stdout))
	if len(f) != 3 || f[2] != s.ID {
		t.Fatalf("root in the sandbox: %q", out.Stdout)
	}
	if bnd, _ := strconv.ParseUint(f[1], 16, 64); bnd&(1<<21) != 0 {
		t.Fatalf("root in the sandbox has CAP_SYS_ADMIN in its bounding set: %q", out.Stdout)
	}
	sn, err := o.c.SnapshotWith(ctx, s.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := o.c.ForkSnapshot(ctx, sn.ID, client.ForkRequest{Count: 1})
	if err != nil || len(res.Sessions) != 1 {
		t.Fatalf("fork of the memory snapshot: %+v %v", res, err)
	}
	clone := res.Sessions[0]
	got, err := o.c.ExecCollect(ctx, clone.ID, client.ExecRequest{Argv: []string{"hostname"}})
	if err != nil || strings.TrimSpace(string(got.Stdout)) != clone.ID {
		t.Fatalf("restored clone's hostname %q (%v), want %s: the agent lacks CAP_SYS_ADMIN", got.Stdout, err, clone.ID)
	}
}

// dynamic reports whether f asks for a program interpreter (a dynamic
// loader).
func dynamic(f *elf.File) bool {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// TestGVisorAgentNeverReady proves a create whose agent never answers
// (here a stand-in agent that only sleeps) ends with a 503 that says so,
// with Retry-After and its own problem type (a busy host is the usual
// cause: a retry later can succeed), and leaves nothing behind; and that
// a create whose agent exits at once fails without waiting for the
// readiness wait to run out.
func TestGVisorAgentNeverReady(t *testing.T) {
	needGVisor(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(dir, "forkbox-agent")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nexec sleep 100000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A short base wait (gVisor's is 3 times as long, more on a loaded host).
	o := newOwnDaemonWith(t, func(opts *daemon.Options) { opts.AgentPath, opts.AgentReadyTimeout = fake, time.Second })
	status, hdr, body := rawCallAt(t, o.d.URL, o.key, "POST", "/v1/sessions", map[string]any{"isolation": "gvisor"}, nil)
	if status != 503 || problemType(body) != "/problems/sandbox-not-ready" {
		t.Fatalf("create with an agent that never answers: %d %s, want 503 sandbox-not-ready", status, body)
	}
	if n, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || n < 1 {
		t.Fatalf("503 with Retry-After %q", hdr.Get("Retry-After"))
	}
	ss, err := o.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{All: true})
	if err != nil || len(ss) != 1 || ss[0].State != "terminated" || ss[0].Reason != "error" {
		t.Fatalf("sessions after the failed create: %+v %v", ss, err)
	}
	assertGone(t, o.dataDir, ss[0].ID)

	// The installed agent now exits at once, as an agent that refuses to
	// start does.
	installed := filepath.Join(o.dataDir, "bin", "forkbox-agent")
	if err := os.WriteFile(installed, []byte("#!/bin/sh\necho 'refusing to start: test' >&2\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o.d.Shutdown(ctxFor(t, time.Minute))
	o.d = nil
	o.tune = func(opts *daemon.Options) { opts.AgentPath, opts.AgentReadyTimeout = installed, time.Hour }
	o.start(t)
	began := time.Now()
	status, _, body = rawCallAt(t, o.d.URL, o.key, "POST", "/v1/sessions", map[string]any{"isolation": "gvisor"}, nil)
	if status != 500 || time.Since(began) > time.Minute {
		t.Fatalf("create with an agent that exits: %d %s after %s, want a 500 without waiting an hour", status, body, time.Since(began))
	}
}

// TestGVisorOverMemoryNamed proves a gVisor sandbox that goes over its
// memory limit (which stops the whole sandbox: the host kills the
// Sentry) ends with a detail that says so, not just that its init exited.
func TestGVisorOverMemoryNamed(t *testing.T) {
	needGVisor(t)
	s := newSession(t, client.CreateRequest{Isolation: "gvisor", MemoryMB: 128})
	ctx := ctxFor(t, 2*time.Minute)
	// The exec fails with the sandbox; the session's end is what counts.
	_, _ = env.c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: []string{"python3", "-c",
		"b = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1"}})
	got := waitEnded(t, env.c, s.ID, 60*time.Second)
	if got == nil || got.State != "terminated" || got.Reason != "error" || !strings.Contains(got.Detail, "memory limit") {
		t.Fatalf("session over its memory limit: %+v, want reason error naming the memory limit", got)
	}
	assertGone(t, env.dataDir, s.ID)
}
