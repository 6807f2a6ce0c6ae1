package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestWarmPool proves a pool fills in the background, a fitting create
// takes a ready member (with the request's env, user and metadata
// applied), a member is never handed out twice, and a failed member is
// replaced.
func TestWarmPool(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 2*time.Minute)
	const cpu = 0.75 // limits no other test asks for, so only this test takes members
	if _, err := env.c.SetPool(ctx, client.Pool{Template: "base", Size: 2, CPU: cpu}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = env.c.SetPool(ctxFor(t, time.Minute), client.Pool{Template: "base", Size: 0}) })
	ready := func() int {
		ps, err := env.c.Pools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Template == "base" && p.CPU == cpu {
				return p.Ready
			}
		}
		return 0
	}
	waitFor(t, func() bool { return ready() == 2 })
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		s := newSession(t, client.CreateRequest{CPU: cpu, Env: map[string]string{"N": "v"}, Metadata: map[string]string{"i": "x"}})
		if seen[s.ID] {
			t.Fatalf("pool handed out %s twice", s.ID)
		}
		seen[s.ID] = true
		if got := sh(t, s.ID, "echo $N; id -un; hostname; ls /tmp | wc -l"); got != "v\nuser\n"+s.ID+"\n0\n" {
			t.Fatalf("session %d from the pool: %q", i, got)
		}
		sh(t, s.ID, "touch /tmp/used")
	}
	waitFor(t, func() bool { return ready() == 2 })
	// Kill a ready member's init behind the daemon's back: the claim finds
	// it dead, discards it and the create still succeeds.
	members := poolMembers(t)
	if len(members) == 0 {
		t.Fatal("no pool members found on the host")
	}
	killInit(t, members[0])
	s := newSession(t, client.CreateRequest{CPU: cpu})
	if got := sh(t, s.ID, "echo ok"); got != "ok\n" {
		t.Fatalf("create after a member died: %q", got)
	}
	waitFor(t, func() bool { return ready() == 2 })
}

// poolMembers lists sandboxes on the host that the API does not list (the
// pool's members).
func poolMembers(t *testing.T) []string {
	t.Helper()
	listed := map[string]bool{}
	ss, err := env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		listed[s.ID] = true
	}
	var out []string
	for _, line := range strings.Fields(runHost(t, "ls", env.dataDir+"/sandboxes")) {
		if !listed[line] {
			out = append(out, line)
		}
	}
	return out
}
