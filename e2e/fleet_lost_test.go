package e2e

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
)

// TestFleetHostLost runs three `forkbox serve` hosts of one JetStream
// cluster. The test joins the cluster as a fourth NATS node (no forkbox
// host: it has no registry record) to read the fleet's directory and to
// write the entries of the sessions it creates, as their owning host
// writes them. Host c, with two running sessions, is killed (SIGKILL):
// within --host-lost-after its entries become terminated/host-lost, a
// REST GET of one through host a answers 410 session-terminated naming
// host-lost, and host b's session stays live. c is restarted on the same
// data directory: before it lists ready again it has destroyed both
// sandboxes (no cgroup, runc state, mount or directory left; its own
// listing has none) and removed their entries. Then b is drained through
// a's REST API and the CLI: every host lists it draining with its
// sessions left, not placeable, until it is undrained.
func TestFleetHostLost(t *testing.T) {
	need(t)
	ids := []string{"a", "b", "c"}
	f := newTestFleet(t, ids, []string{"t"}, "--storage-size", "1", "--host-lost-after", "4s") // t: the test's own NATS node
	procs := f.startAll(t)
	hosts := func(c *client.Client) map[string]client.Host {
		l, err := c.Hosts(ctxFor(t, 10*time.Second))
		if err != nil {
			return nil
		}
		m := map[string]client.Host{}
		for _, h := range l.Hosts {
			m[h.ID] = h
		}
		return m
	}
	ready := func(c *client.Client, want ...string) bool {
		m := hosts(c)
		for _, id := range want {
			if m[id].State != "ready" {
				return false
			}
		}
		return true
	}

	tf, err := fleet.Start(context.Background(), f.nodeOptions("t"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tf.Close)
	dir, err := fleet.OpenDirectory(ctxFor(t, time.Minute), tf)
	if err != nil {
		t.Fatal(err)
	}
	// located creates a session on host i and writes its entry.
	located := func(i int) string {
		t.Helper()
		s, _, err := procs[i].c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{Host: ids[i]}, "")
		if err != nil {
			t.Fatalf("create on %s: %v", ids[i], err)
		}
		if err := dir.Put(ctxFor(t, 30*time.Second), fleet.Location{Kind: fleet.KindSession, ID: s.ID, Host: ids[i]}); err != nil {
			t.Fatal(err)
		}
		return s.ID
	}
	onC := []string{located(2), located(2)}
	onB := located(1)
	for _, id := range onC {
		if _, err := procs[2].c.Exec(ctxFor(t, time.Minute), id, client.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
			t.Fatalf("exec in %s on c: %v", id, err)
		}
	}

	procs[2].kill()
	waitUntil(t, time.Minute, "c's sessions terminated host-lost in the directory", func() bool {
		for _, id := range onC {
			l, err := dir.Get(ctxFor(t, 10*time.Second), fleet.KindSession, id)
			if err != nil || l.State != fleet.LocationTerminated || l.Reason != fleet.ReasonHostLost {
				return false
			}
		}
		return true
	})
	if h := hosts(procs[0].c)["c"]; h.State != "lost" || h.Placeable || h.Pooled != 0 {
		t.Fatalf("a lists c %+v, want lost, not placeable, no pool members", h)
	}
	_, err = procs[0].c.GetSession(ctxFor(t, 10*time.Second), onC[0])
	if !errors.Is(err, errdefs.ErrTerminated) || !strings.Contains(err.Error(), "host-lost") {
		t.Fatalf("GET of c's session through a: %v, want 410 session-terminated (host-lost)", err)
	}
	if l, err := dir.Get(ctxFor(t, 10*time.Second), fleet.KindSession, onB); err != nil || l.State != "" {
		t.Fatalf("b's session entry: %+v, %v; want live", l, err)
	}

	// c comes back: it reconciles before its first heartbeat.
	f.start(t, 2)
	waitUntil(t, 2*time.Minute, "a lists c ready again", func() bool { return ready(procs[0].c, "c") })
	dataC := f.dataDir(2)
	for _, id := range onC {
		if _, err := dir.Get(ctxFor(t, 10*time.Second), fleet.KindSession, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("entry of %s after c rejoined: %v, want removed", id, err)
		}
		assertGone(t, dataC, id)
	}
	// The list is the fleet's (b's session is in it): c's own are none.
	for _, s := range sessionsFrom(t, procs[2].c) {
		if s.Host == "c" {
			t.Errorf("c lists its session %s (%s) after it reconciled, want none", s.ID, s.State)
		}
	}
	if dirs := sandboxDirs(t, dataC); len(dirs) != 0 {
		t.Errorf("c's sandbox directories after it reconciled: %v", dirs)
	}

	// Drain b through a: listed draining with its one session left.
	h, err := procs[0].c.DrainHost(ctxFor(t, 10*time.Second), "b")
	if err != nil {
		t.Fatal(err)
	}
	if h.State != "draining" || h.Placeable || h.Sessions != 1 {
		t.Fatalf("drain b: %+v, want draining, not placeable, 1 session", h)
	}
	if _, err := procs[0].c.DrainHost(ctxFor(t, 10*time.Second), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("drain of an unknown host: %v, want not found", err)
	}
	// A host's read may be served by a replica the drain has not reached
	// yet: within a few seconds every host lists it.
	waitUntil(t, 30*time.Second, "every host lists b draining, not placeable", func() bool {
		for _, p := range procs {
			if h := hosts(p.c)["b"]; h.State != "draining" || h.Placeable {
				return false
			}
		}
		return true
	})
	key, err := os.ReadFile(filepath.Join(f.dataDir(0), "api-key"))
	if err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(env.cli, append([]string{"--url", procs[0].c.BaseURL()}, args...)...)
		cmd.Env = append(os.Environ(), client.EnvAPIKey+"="+strings.TrimSpace(string(key)))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("forkbox %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	if err := procs[1].c.DeleteSession(ctxFor(t, time.Minute), onB); err != nil {
		t.Fatal(err)
	}
	if out := cli("host", "drain", "b", "--wait", "1m"); !strings.Contains(out, "host b: drained") {
		t.Fatalf("forkbox host drain b --wait: %s", out)
	}
	if out := cli("hosts"); !strings.Contains(out, "draining (0 left)") {
		t.Fatalf("forkbox hosts while b drains:\n%s", out)
	}
	cli("host", "undrain", "b")
	waitUntil(t, time.Minute, "every host lists b ready after the undrain", func() bool {
		for _, p := range procs {
			if h := hosts(p.c)["b"]; h.State != "ready" || !h.Placeable {
				return false
			}
		}
		return true
	})
	_ = dir.Delete(ctxFor(t, 10*time.Second), fleet.KindSession, onB)
}
