package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestAloneThenCluster proves a host that ran alone can join a cluster
// later on the same store directory: it starts, and the registry bucket
// is a replicated one on the three nodes that takes its records. What
// its store held alone is not guaranteed to carry over (the cluster's
// meta leader may place the bucket afresh): records are rewritten every
// heartbeat, and the README says so for snapshot copies.
func TestAloneThenCluster(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alone, err := Start(ctx, Options{StoreDir: dir, NodeID: "a"}, quietLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenRegistry(ctx, alone, RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Put(ctx, Host{ID: "a", Version: "dev"}); err != nil {
		t.Fatal(err)
	}
	alone.Close()

	ids := []string{"a", "b", "c"}
	ports := freePorts(t, 3)
	var nodes []*Fleet
	for i, id := range ids {
		var peers []Peer
		for j, p := range ids {
			if j != i {
				peers = append(peers, Peer{ID: p, Addr: fmt.Sprintf("127.0.0.1:%d", ports[j])})
			}
		}
		store := t.TempDir()
		if id == "a" {
			store = dir
		}
		f, err := Start(ctx, Options{StoreDir: store, Cluster: "test", NodeID: id, Peers: peers,
			Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Secret: testSecret}, quietLog(t).With("node", id))
		if err != nil {
			t.Fatalf("node %s: %v", id, err)
		}
		t.Cleanup(f.Close)
		nodes = append(nodes, f)
	}
	var regs []*Registry
	for _, f := range nodes {
		r, err := OpenRegistry(ctx, f, RegistryOptions{})
		if err != nil {
			t.Fatalf("node %s: %v", f.NodeID(), err)
		}
		regs = append(regs, r)
	}
	if err := regs[0].Put(ctx, Host{ID: "a", Version: "dev"}); err != nil {
		t.Fatal(err)
	}
	// c's read may be served by a replica the write has not reached yet
	// (the KV stream allows direct reads from followers): the write must
	// be there within a few seconds, and be the only host.
	var hosts []Host
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		hosts, err = regs[2].List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(hosts) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(hosts) != 1 || hosts[0].ID != "a" {
		t.Fatalf("hosts seen by c after a's write: %+v", hosts)
	}
	s, err := nodes[1].js.Stream(ctx, "KV_"+HostsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("host registry after joining: %d replicas, want 3", r)
	}
}
