package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/testport"
)

// fleetSecret is the text of every test fleet's secret file.
const fleetSecret = "e2e-fleet-secret-0123456789abcdef0123456789"

// testFleet is `forkbox serve` processes of one cluster ("e2e") on
// loopback ports, each with its own data directory under one temporary
// directory traversable by the sandbox uid range, their routes
// authenticated with one secret file; and, for a test that runs a NATS
// node of its own, the ports of such nodes (not in the hosts' --peers:
// those nodes dial the hosts).
type testFleet struct {
	tmp    string
	secret string // path of the secret file
	ids    []string
	nodes  []string       // the test's own NATS nodes
	ports  map[string]int // route port of each host and node
	args   []string       // flags every host gets
	procs  []*serveProc   // by index of ids; nil while one is down
}

// newTestFleet makes the fleet's directory, secret file and ports for
// hosts ids and the test's own NATS nodes; args are flags every host
// gets beside the cluster's. It starts nothing (start, startAll). The
// cleanup it registers stops every host still running (destroying its
// sessions), runs `forkbox down` on each data directory (which takes
// down what a killed host left), releases its storage and removes the
// directory.
func newTestFleet(t *testing.T, ids, nodes []string, args ...string) *testFleet {
	t.Helper()
	tmp, err := os.MkdirTemp("", "forkbox-fleet-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o711)
	f := &testFleet{tmp: tmp, secret: filepath.Join(tmp, "fleet.secret"), ids: ids, nodes: nodes,
		ports: map[string]int{}, args: args, procs: make([]*serveProc, len(ids))}
	t.Cleanup(func() {
		for i, p := range f.procs {
			if p != nil {
				p.stop()
			}
			data := f.dataDir(i)
			if out, err := exec.Command(env.cli, "down", "--data-dir", data).CombinedOutput(); err != nil {
				t.Errorf("forkbox down %s: %v: %s", ids[i], err, out)
			}
			_ = daemon.ReleaseStorage(data)
			os.RemoveAll(datadir.Layout{Root: data}.Scratch())
		}
		os.RemoveAll(tmp)
	})
	if err := os.WriteFile(f.secret, []byte(fleetSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, id := range slices.Concat(ids, nodes) {
		f.ports[id] = testport.Free(t)
	}
	return f
}

// dataDir is host i's data directory.
func (f *testFleet) dataDir(i int) string { return filepath.Join(f.tmp, f.ids[i]) }

// addr is the route address of host or node id.
func (f *testFleet) addr(id string) string { return fmt.Sprintf("127.0.0.1:%d", f.ports[id]) }

// serveArgs are host i's flags: the cluster's, then f.args, then extra.
func (f *testFleet) serveArgs(i int, extra ...string) []string {
	var peers []string
	for j, id := range f.ids {
		if j != i {
			peers = append(peers, id+"="+f.addr(id))
		}
	}
	args := []string{"--spares", "0", "--stop-sessions", "--cluster", "e2e", "--node-id", f.ids[i],
		"--peers", strings.Join(peers, ","), "--fleet-listen", f.addr(f.ids[i]), "--fleet-secret-file", f.secret}
	return slices.Concat(args, f.args, extra)
}

// start starts (or restarts) host i with extra flags after serveArgs',
// failing t when it does not come up.
func (f *testFleet) start(t *testing.T, i int, extra ...string) *serveProc {
	t.Helper()
	p, err := startServe(t, f.dataDir(i), f.serveArgs(i, extra...)...)
	if err != nil {
		t.Fatalf("host %s: %v", f.ids[i], err)
	}
	f.procs[i] = p
	return p
}

// startAll starts every host and waits until each lists every host
// ready and has its directory open.
func (f *testFleet) startAll(t *testing.T) []*serveProc {
	t.Helper()
	for i := range f.ids {
		f.start(t, i)
	}
	f.waitReady(t)
	return f.procs
}

// waitReady waits (at most 2 minutes each) until every running host
// lists every host ready, and has its fleet directory open.
func (f *testFleet) waitReady(t *testing.T) {
	t.Helper()
	waitUntil(t, 2*time.Minute, "every host lists every host ready", func() bool {
		for _, p := range f.procs {
			if p == nil {
				continue
			}
			l, err := p.c.Hosts(ctxFor(t, 10*time.Second))
			if err != nil {
				return false
			}
			ready := 0
			for _, h := range l.Hosts {
				if h.State == "ready" {
					ready++
				}
			}
			if ready != len(f.ids) {
				return false
			}
		}
		return true
	})
	waitUntil(t, 2*time.Minute, "every host's directory open", func() bool {
		for _, p := range f.procs {
			if p != nil && !strings.Contains(p.log.String(), "fleet: directory open") {
				return false
			}
		}
		return true
	})
}

// nodeOptions are the fleet options of the test's own NATS node id
// (one of newTestFleet's nodes): it joins the cluster by dialling the
// hosts.
func (f *testFleet) nodeOptions(id string) fleet.Options {
	var peers []fleet.Peer
	for _, h := range f.ids {
		peers = append(peers, fleet.Peer{ID: h, Addr: f.addr(h)})
	}
	return fleet.Options{StoreDir: filepath.Join(f.tmp, id), Cluster: "e2e", NodeID: id, Peers: peers,
		Listen: f.addr(id), Secret: fleetSecret}
}

// startFleet starts one `forkbox serve` per id as one cluster (2 GiB of
// storage each, args added to every host's flags) and waits until every
// host lists every other ready with its directory open. The daemons are
// stopped (their sessions destroyed) when the test ends.
func startFleet(t *testing.T, ids []string, args ...string) []*serveProc {
	t.Helper()
	return newTestFleet(t, ids, nil, slices.Concat([]string{"--storage-size", "2"}, args)...).startAll(t)
}
