package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// Regression tests for attacks by the code inside a sandbox on the host and
// the daemon (a red-team review). Each names the attack it replays.

// TestHostileDeepTreeTeardown: a sandbox nests directories deeper than the
// daemon's open-files limit in its writable layer (`mkdir d; cd d` in a
// loop). Destroying it must still remove everything; os.RemoveAll needed one
// descriptor per level, so the teardown failed with EMFILE, the session
// stayed terminating forever and every janitor retry starved the daemon of
// descriptors.
func TestHostileDeepTreeTeardown(t *testing.T) {
	need(t)
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	limit := rl.Cur
	if limit > 8192 {
		// Keep the tree small: lower this process's (the daemon's) limit
		// while the sandbox is destroyed.
		lowered := rl
		lowered.Cur = 4096
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
			t.Fatal(err)
		}
		defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
		limit = lowered.Cur
	}
	depth := limit + 500
	s, _, err := env.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("import os\nos.chdir('/tmp')\nfor _ in range(%d):\n    os.mkdir('d'); os.chdir('d')\nprint('ok')", depth)
	if out := sh(t, s.ID, "python3 -c \""+script+"\""); strings.TrimSpace(out) != "ok" {
		t.Fatalf("building the tree: %q", out)
	}
	if err := env.c.DeleteSession(ctxFor(t, 2*time.Minute), s.ID); err != nil {
		t.Fatalf("destroying a sandbox with a %d-deep tree (open-files limit %d): %v", depth, limit, err)
	}
	assertGone(t, env.dataDir, s.ID)
}

// TestHostileAgentLogCapped: root in a sandbox signals pid 1 in a loop; the
// agent logs every forwarded signal to agent.log, a host file outside the
// sandbox's layer and limits. The log must stop growing at the agent's cap
// (1 MiB) instead of filling the host's disk.
func TestHostileAgentLogCapped(t *testing.T) {
	const maxLog = 1 << 20
	s := newSession(t, client.CreateRequest{})
	flood := "import os, signal, time\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\nend = time.time() + 50\nwhile time.time() < end:\n    os.kill(1, signal.SIGHUP)\n"
	pid, err := env.c.ExecBackground(ctxFor(t, time.Minute), s.ID, client.ExecRequest{
		Argv: []string{"python3", "-c", flood}, User: "root", TimeoutS: 55,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer env.c.Kill(ctxFor(t, time.Minute), s.ID, pid)
	logPath := filepath.Join(env.dataDir, "sandboxes", s.ID, "agent.log")
	size := func() int64 {
		fi, err := os.Stat(logPath)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	deadline := time.Now().Add(45 * time.Second)
	for size() < maxLog && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	reached := size()
	time.Sleep(3 * time.Second) // the flood goes on
	if got := size(); got > maxLog+4096 {
		t.Fatalf("agent.log grew to %d bytes under a signal flood; the cap is %d", got, maxLog)
	}
	if reached < maxLog-4096 {
		t.Logf("the flood only wrote %d bytes of log in 45 s; the cap was not exercised", reached)
	}
	// The agent still serves (a files call: a new command would get the
	// flood's SIGHUP forwarded to it).
	if _, err := env.c.ListDir(ctxFor(t, time.Minute), s.ID, "/tmp", 1, ""); err != nil {
		t.Fatalf("the agent stopped serving under the flood: %v", err)
	}
}

// TestHostileSandboxFilesHiddenFromHostUsers: the mounts in the host's
// /proc/mounts tell every local user where each sandbox's files are. With a
// world-traversable path to them any host user could read the sandbox's
// files (home files are 0644) and drop files into its /tmp (1777). Only
// root (and the sandboxes' own ids) may pass.
func TestHostileSandboxFilesHiddenFromHostUsers(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	sh(t, s.ID, "echo sandbox-secret > /tmp/secret && chmod 644 /tmp/secret")
	p := hostPath(t, env.dataDir, s.ID, "tmp/secret")
	if b, err := os.ReadFile(p); err != nil || !strings.Contains(string(b), "sandbox-secret") {
		t.Fatalf("root cannot read %s (%v): the test looks in the wrong place", p, err)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"read a sandbox file", []string{"cat", p}},
		{"write into the sandbox's /tmp", []string{"sh", "-c", "echo injected > " + filepath.Dir(p) + "/injected"}},
	} {
		cmd := exec.Command(c.args[0], c.args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("host user nobody could %s: %s", c.name, out)
		}
	}
}

// TestHostileHugeListingBounded: a sandbox fills a directory with tens of
// thousands of long names; listing it must fail with resource_exhausted
// rather than the daemon taking the whole listing (hundreds of megabytes of
// host memory for a sandbox-sized directory) into memory.
func TestHostileHugeListingBounded(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	sh(t, s.ID, `python3 -c "
import os
os.mkdir('/tmp/many')
for i in range(80000):
    open('/tmp/many/%s%06d' % ('x' * 240, i), 'w').close()
"`)
	_, err := env.c.ListDir(ctxFor(t, 2*time.Minute), s.ID, "/tmp/many", 1, "")
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("listing 80000 long names: err = %v, want resource exhausted", err)
	}
	if _, err := env.c.ListDir(ctxFor(t, time.Minute), s.ID, "/tmp", 1, ""); err != nil {
		t.Fatalf("a small listing after the big one: %v", err)
	}
}
