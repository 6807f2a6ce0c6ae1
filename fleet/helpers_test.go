package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/testport"
)

// testSecret is the fleet secret of the test clusters.
const testSecret = "test-secret-0123456789abcdef0123456789abcdef"

// quietLog drops log lines unless the test runs verbose.
func quietLog(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(&testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// freePorts returns n TCP ports on 127.0.0.1 that are free now and
// that no outgoing connection can take (testport.Free): the nodes of a
// test cluster must know each other's before any starts.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = testport.Free(t)
	}
	return ports
}

// startAlone starts a one-host fleet on a fresh store directory.
func startAlone(t *testing.T) *Fleet {
	t.Helper()
	f, err := Start(context.Background(), Options{StoreDir: t.TempDir()}, quietLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// startCluster starts a three-node JetStream cluster (ids a, b, c) on
// 127.0.0.1 random ports, each node with its own store, and waits until
// every node has routes to the two others.
func startCluster(t *testing.T) []*Fleet {
	t.Helper()
	ids := []string{"a", "b", "c"}
	ports := freePorts(t, len(ids))
	nodes := make([]*Fleet, len(ids))
	for i, id := range ids {
		var peers []Peer
		for j, p := range ids {
			if j != i {
				peers = append(peers, Peer{ID: p, Addr: fmt.Sprintf("127.0.0.1:%d", ports[j])})
			}
		}
		f, err := Start(context.Background(), Options{
			StoreDir: t.TempDir(), Cluster: "test", NodeID: id, Peers: peers,
			Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Secret: testSecret,
		}, quietLog(t).With("node", id))
		if err != nil {
			t.Fatalf("node %s: %v", id, err)
		}
		t.Cleanup(f.Close)
		nodes[i] = f
	}
	waitFor(t, 30*time.Second, "every node routed to the two others", func() bool {
		for _, f := range nodes {
			if f.ConnectedPeers() < 2 {
				return false
			}
		}
		return true
	})
	return nodes
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
