package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/freeport"
)

// The fleet simulation's cluster: simNodes embedded NATS nodes in this
// process (fleetsim.go runs the steps on it).

// simCluster is the simulation's JetStream cluster.
type simCluster struct {
	nodes []*fleet.Fleet
	dir   string
}

// startSimCluster starts simNodes embedded nodes on 127.0.0.1 ports
// picked free a moment before, each with its own store under a new
// temporary directory, and waits (at most 30 s) until each has routes
// to the others.
func startSimCluster(ctx context.Context) (*simCluster, error) {
	dir, err := os.MkdirTemp("", "forkbox-fleet-sim-")
	if err != nil {
		return nil, err
	}
	c := &simCluster{dir: dir}
	ports, err := freeport.LoopbackN(simNodes)
	if err != nil {
		c.close()
		return nil, err
	}
	secret := randomSecret()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range simNodes {
		var peers []fleet.Peer
		for j := range simNodes {
			if j != i {
				peers = append(peers, fleet.Peer{ID: fmt.Sprintf("n%d", j), Addr: fmt.Sprintf("127.0.0.1:%d", ports[j])})
			}
		}
		f, err := fleet.Start(ctx, fleet.Options{StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i)), Cluster: "bench",
			NodeID: fmt.Sprintf("n%d", i), Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Peers: peers, Secret: secret}, quiet)
		if err != nil {
			c.close()
			return nil, fmt.Errorf("fleet node n%d: %w", i, err)
		}
		c.nodes = append(c.nodes, f)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		routed := true
		for _, f := range c.nodes {
			routed = routed && f.ConnectedPeers() >= simNodes-1
		}
		if routed {
			return c, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.close()
			return nil, errors.New("fleet nodes not routed to each other after 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// close stops the nodes and removes their stores.
func (c *simCluster) close() {
	for _, f := range c.nodes {
		f.Close()
	}
	_ = os.RemoveAll(c.dir)
}

// diskBytes is the space the nodes' stores take on disk (allocated
// blocks), in bytes.
func (c *simCluster) diskBytes() int64 {
	var n int64
	_ = filepath.WalkDir(c.dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// bucketSize returns the messages and bytes of bucket's stream (0, 0
// when it cannot be read).
func (c *simCluster) bucketSize(ctx context.Context, bucket string) (msgs, bytes uint64) {
	kv, err := c.nodes[0].JetStream().KeyValue(ctx, bucket)
	if err != nil {
		return 0, 0
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, 0
	}
	return st.Values(), st.Bytes()
}

// reset deletes the fleet's buckets, so that the next step starts empty.
func (c *simCluster) reset(ctx context.Context) error {
	js := c.nodes[0].JetStream()
	for _, b := range []string{fleet.HostsBucket, fleet.LocationsBucket} {
		if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("delete bucket %s: %w", b, err)
		}
	}
	return nil
}

// randomSecret is a fleet secret for one run.
func randomSecret() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 48)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return string(b)
}
