package fleetstate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/testport"
	"github.com/forkbox/forkbox/store"
)

// testSecret is the fleet secret of the test clusters.
const testSecret = "test-secret-0123456789abcdef0123456789abcdef"

func quietLog() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testOut{}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testOut struct{}

func (testOut) Write(p []byte) (int, error) { fmt.Print(string(p)); return len(p), nil }

// host is one simulated host of a test fleet: its fleet node and its own
// SQLite store.
type host struct {
	id   string
	f    *fleet.Fleet
	st   *store.Store
	opts fleet.Options
}

// stop shuts h's fleet node down (its store directory stays).
func (h *host) stop() { h.f.Close() }

// restart starts h's fleet node again on the same store directory and
// route address.
func (h *host) restart(t *testing.T) {
	t.Helper()
	f, err := fleet.Start(context.Background(), h.opts, quietLog())
	if err != nil {
		t.Fatalf("restart %s: %v", h.id, err)
	}
	t.Cleanup(f.Close)
	h.f = f
}

// startHosts starts a real three-node JetStream cluster (ids a, b, c) on
// 127.0.0.1 random ports, each node with a store of its own, and waits
// until every node has routes to the two others.
func startHosts(t testing.TB) []*host {
	t.Helper()
	ids := []string{"a", "b", "c"}
	addrs := make([]string, len(ids))
	for i := range ids {
		addrs[i] = testport.Addr(t) // not one an outgoing connection can take first
	}
	hosts := make([]*host, len(ids))
	for i, id := range ids {
		var peers []fleet.Peer
		for j, p := range ids {
			if j != i {
				peers = append(peers, fleet.Peer{ID: p, Addr: addrs[j]})
			}
		}
		opts := fleet.Options{
			StoreDir: t.TempDir(), Cluster: "test", NodeID: id, Peers: peers, Listen: addrs[i], Secret: testSecret,
		}
		f, err := fleet.Start(context.Background(), opts, quietLog())
		if err != nil {
			t.Fatalf("node %s: %v", id, err)
		}
		t.Cleanup(f.Close)
		st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "forkbox.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		hosts[i] = &host{id: id, f: f, st: st, opts: opts}
	}
	waitFor(t, 30*time.Second, "every node routed to the two others", func() bool {
		for _, h := range hosts {
			if h.f.ConnectedPeers() < 2 {
				return false
			}
		}
		return true
	})
	return hosts
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runShared opens and runs a Shared for every host until the test ends.
func runShared(t *testing.T, hosts []*host) []*Shared {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, len(hosts))
	out := make([]*Shared, len(hosts))
	for i, h := range hosts {
		octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
		sh, err := OpenShared(octx, h.f, h.st, quietLog())
		ocancel()
		if err != nil {
			cancel()
			t.Fatalf("host %s: %v", h.id, err)
		}
		h.st.OnChange(sh.Changed)
		out[i] = sh
		go func() { sh.Run(ctx); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		cancel()
		for range hosts {
			<-done
		}
	})
	return out
}
