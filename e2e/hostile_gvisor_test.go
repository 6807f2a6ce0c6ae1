package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// markingBomb is forkBomb that writes the error of its first refused
// fork (its name, "EAGAIN") to /tmp/refused.
const markingBomb = `import errno, os, time
marked = False
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError as e:
        if not marked:
            open("/tmp/refused", "w").write(errno.errorcode[e.errno])
            marked = True
        time.sleep(0.01)
`

// TestHostileGVisorForkBombRefusedInside proves a fork bomb in a gVisor
// sandbox is refused by gVisor's own kernel (RLIMIT_NPROC, enforced by the
// Sentry) before the Sentry's host threads reach the host pids limit, which
// would stop the whole sandbox: the bomb's forks fail with EAGAIN and the
// agent still runs commands; then the abuse detector ends the session as
// a fork bomb (reason abuse), as in the runc tier, instead of the sandbox
// dying with reason error. (The checks during the bomb need no fork of the
// user's, which the limit refuses: the marker is read through the files
// API and echo is started by the agent.)
func TestHostileGVisorForkBombRefusedInside(t *testing.T) {
	needGVisor(t)
	_, _, c := newTenant(t, env.c, "gvbomb", client.TenantPolicy{})
	ctx := ctxFor(t, 3*time.Minute)
	// Memory to spare: in gVisor going over the memory limit stops the
	// whole sandbox, and each forked Python copies a few MiB.
	s, _, err := c.CreateSession(ctx, client.CreateRequest{Isolation: "gvisor", Pids: 64, MemoryMB: 1024}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSession(context.Background(), s.ID) })
	if _, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{Argv: []string{"python3", "-c", markingBomb}}); err != nil {
		t.Fatal(err)
	}
	refused := ""
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && refused == ""; time.Sleep(100 * time.Millisecond) {
		rc, err := c.Download(ctx, s.ID, "/tmp/refused", "")
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			got, _ := c.GetSession(ctx, s.ID)
			t.Fatalf("read the marker during the bomb: %v; session %+v", err, got)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		refused = string(b)
	}
	if refused != "EAGAIN" {
		t.Fatalf("the bomb's forks were not refused inside the sandbox (marker %q)", refused)
	}
	var out strings.Builder
	if res, err := c.Exec(ctx, s.ID, client.ExecRequest{Argv: []string{"echo", "alive"}}, &out, nil); err != nil || res.ExitCode != 0 || out.String() != "alive\n" {
		got, _ := c.GetSession(ctx, s.ID)
		t.Fatalf("the agent does not run commands during the bomb: %+v %v %q; session %+v", res, err, out.String(), got)
	}
	got := waitEnded(t, c, s.ID, 90*time.Second)
	if got == nil || got.State != "terminated" || got.Reason != "abuse" || !strings.Contains(got.Detail, "pids limit") {
		t.Fatalf("gVisor fork bomb session: %+v, want it ended as a fork bomb (reason abuse)", got)
	}
	t.Logf("ended: %s: %s", got.Reason, got.Detail)
}

// manyUsersBomb is run as root: it starts a fork bomb under each of 40
// uids, so that no per-user limit stops it: the sandbox goes over its
// host pids limit.
const manyUsersBomb = `import os, time
for uid in range(2000, 2040):
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.02)
        continue
    if pid == 0:
        os.setgid(uid)
        os.setuid(uid)
        while True:
            try:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
            except OSError:
                time.sleep(0.02)
time.sleep(120)
`

// TestHostileGVisorForkBombAcrossUsersNamed proves a bomb that gets past
// the per-user limit (root forking under many uids) and so reaches the
// host pids limit, which stops the whole gVisor sandbox (the 2024 runsc;
// a newer one's Sentry may go on, refusing the forks, until the abuse
// detector ends it: reason abuse), ends the session with reason pids-limit
// (not error), and that the abuse detector counts it as a fork bomb: the
// tenant is flagged.
func TestHostileGVisorForkBombAcrossUsersNamed(t *testing.T) {
	needGVisor(t)
	name, _, c := newTenant(t, env.c, "gvbomb2", client.TenantPolicy{})
	ctx := ctxFor(t, 3*time.Minute)
	// 2 GiB, so that the bomb's sleeping children (memory in the Sentry)
	// do not reach the memory limit before the pids limit: with 512 MiB
	// the 2026 runsc's sandbox sometimes ended over its memory first.
	s, _, err := c.CreateSession(ctx, client.CreateRequest{Isolation: "gvisor", Pids: 64, MemoryMB: 2048}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSession(context.Background(), s.ID) })
	if _, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{User: "root", Argv: []string{"python3", "-c", manyUsersBomb}}); err != nil {
		t.Fatal(err)
	}
	got := waitEnded(t, c, s.ID, 90*time.Second)
	// The 2024 runsc's Sentry cannot go on once the host refuses it a
	// task. A newer one can (the sandbox's fork fails instead) and may
	// outlive the refusal, until the abuse detector ends it for the
	// refused forks.
	endedAsBomb := got != nil && got.State == "terminated" && (got.Reason == "pids-limit" ||
		!legacyRunsc(t) && got.Reason == "abuse" && strings.Contains(got.Detail, "pids limit"))
	if !endedAsBomb {
		t.Fatalf("session of a bomb over the host pids limit: %+v, want reason pids-limit", got)
	}
	t.Logf("ended: %s: %s", got.Reason, got.Detail)
	tn, err := env.c.GetTenant(ctx, name)
	if err != nil || !strings.Contains(tn.FlagReason, "fork-bomb") {
		t.Fatalf("tenant after the bomb: %+v %v, want it flagged for a fork bomb", tn, err)
	}
	assertGone(t, env.dataDir, s.ID)
}

// readAllEnviron is a shell command that prints every process's environ,
// one variable a line, skipping what it may not read.
const readAllEnviron = `for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f" 2>/dev/null; done; true`

// TestHostileEnvironOfRootHidden proves, in both tiers, that the
// sandbox's user cannot read the agent's environment (its start-up
// configuration) through /proc/PID/environ, and in the runc tier not that
// of a command run as root either (the kernel checks ptrace access). In
// the gVisor tier a root command's environment is readable by every
// process with the 2024 runsc (its procfs does not check access to it;
// the README says so and tells callers to keep secrets out of env), and
// not with the newer runsc, whose procfs checks: the test holds the README
// to both statements.
func TestHostileEnvironOfRootHidden(t *testing.T) {
	for _, tier := range []string{"runc", "gvisor"} {
		t.Run(tier, func(t *testing.T) {
			if tier == "gvisor" {
				needGVisor(t)
			}
			s := newSession(t, client.CreateRequest{Isolation: tier})
			secret := fmt.Sprintf("s3cret-%d", time.Now().UnixNano())
			if _, err := env.c.ExecBackground(ctxFor(t, time.Minute), s.ID, client.ExecRequest{User: "root",
				Env: map[string]string{"ROOT_ONLY_TOKEN": secret}, Cmd: "exec sleep 120"}); err != nil {
				t.Fatal(err)
			}
			// Root sees its own command's environment: the process is there.
			waitFor(t, func() bool {
				res, out, _ := run(t, s.ID, client.ExecRequest{User: "root", Cmd: readAllEnviron})
				return res.ExitCode == 0 && strings.Contains(out, secret)
			})
			for _, user := range []string{"user", "root"} {
				_, out, _ := run(t, s.ID, client.ExecRequest{User: user, Cmd: readAllEnviron})
				if strings.Contains(out, "FORKBOX_") {
					t.Errorf("%s reads the agent's environment: %q", user, truncate(out, 300))
				}
			}
			_, out, _ := run(t, s.ID, client.ExecRequest{Cmd: readAllEnviron})
			leaked := strings.Contains(out, secret)
			switch {
			case tier == "runc" && leaked:
				t.Errorf("user reads a root command's environment in the runc tier")
			case tier == "gvisor" && legacyRunsc(t) && !leaked:
				t.Errorf("user no longer reads a root command's environment in the gVisor tier: " +
					"update the README's gVisor section, which says it can")
			case tier == "gvisor" && !legacyRunsc(t) && leaked:
				t.Errorf("user reads a root command's environment in the gVisor tier: " +
					"update the README's gVisor section, which says the newer runsc refuses it")
			}
		})
	}
}
