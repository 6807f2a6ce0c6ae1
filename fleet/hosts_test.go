package fleet

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/forkbox/forkbox/errdefs"
)

// TestAloneListensNowhere proves a one-host fleet's embedded server has
// no client listener and no route listener, yet JetStream works through
// the in-process connection: the registry takes this host's record.
func TestAloneListensNowhere(t *testing.T) {
	f := startAlone(t)
	if a := f.srv.Addr(); a != nil {
		t.Fatalf("embedded server listens for clients on %v", a)
	}
	if a := f.RouteAddr(); a != "" {
		t.Fatalf("embedded server listens for routes on %s", a)
	}
	if f.Replicas() != 1 || f.Clustered() {
		t.Fatalf("alone: replicas %d, clustered %v", f.Replicas(), f.Clustered())
	}
	ctx := context.Background()
	r, err := OpenRegistry(ctx, f, RegistryOptions{Version: "v1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Put(ctx, Host{ID: f.NodeID(), Version: "v1.2.9", Tiers: []string{"runc"}}); err != nil {
		t.Fatal(err)
	}
	hosts, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hosts) != 1 || hosts[0].ID != "local" || hosts[0].State != HostReady || !hosts[0].Placeable {
		t.Fatalf("hosts %+v, want local ready placeable", hosts)
	}
	if err := r.Put(ctx, Host{ID: "a.b"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Put of a bad id: %v, want invalid argument", err)
	}
}

// TestClusterRegistry runs three hosts' heartbeats on a three-node
// JetStream cluster: every node sees all three ready; the registry's
// bucket has three replicas; stopping one node makes it lost on the
// others after LostAfter while the bucket keeps taking the others'
// heartbeats (R3 with one node down still has a quorum); a host of
// another minor version is listed but not placeable.
func TestClusterRegistry(t *testing.T) {
	nodes := startCluster(t)
	ctx := context.Background()
	opts := RegistryOptions{Heartbeat: 200 * time.Millisecond, LostAfter: 1500 * time.Millisecond, Version: "v1.4.0"}
	regs := make([]*Registry, len(nodes))
	cancels := make([]context.CancelFunc, len(nodes))
	var wg sync.WaitGroup
	for i, f := range nodes {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		r, err := OpenRegistry(octx, f, opts)
		cancel()
		if err != nil {
			t.Fatalf("node %s: %v", f.NodeID(), err)
		}
		regs[i] = r
		rctx, stop := context.WithCancel(ctx)
		cancels[i] = stop
		id, v := f.NodeID(), "v1.4.2"
		if id == "b" {
			v = "v1.5.0"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Run(rctx, func() Host {
				return Host{ID: id, API: "http://" + id, Version: v, Capacity: Capacity{Sessions: 10, CPUs: 2}}
			})
		}()
	}
	t.Cleanup(func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	})
	states := func(r *Registry) map[string]HostState {
		hosts, err := r.List(ctx)
		if err != nil {
			return nil
		}
		m := map[string]HostState{}
		for _, h := range hosts {
			m[h.ID] = h.State
		}
		return m
	}
	for i, r := range regs {
		waitFor(t, 20*time.Second, "node "+nodes[i].NodeID()+" sees a, b and c ready", func() bool {
			s := states(r)
			return s["a"] == HostReady && s["b"] == HostReady && s["c"] == HostReady
		})
	}
	if s, err := nodes[0].js.Stream(ctx, "KV_"+HostsBucket); err != nil {
		t.Fatal(err)
	} else if r := s.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("host registry: %d replicas, want 3", r)
	}
	hosts, err := regs[0].List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		// b runs another minor version; a and c are placeable while
		// ready (a loaded machine may have made one late, and lost).
		if want := h.ID != "b" && h.State == HostReady; h.Placeable != want {
			t.Errorf("host %s (version %s, %s): placeable %v, want %v", h.ID, h.Version, h.State, h.Placeable, want)
		}
	}

	// Node c stops: its heartbeat with it.
	cancels[2]()
	nodes[2].Close()
	before := map[string]time.Time{}
	for _, h := range hosts {
		before[h.ID] = h.Heartbeat
	}
	for i := range 2 {
		waitFor(t, 20*time.Second, "node "+nodes[i].NodeID()+" sees c lost", func() bool {
			return states(regs[i])["c"] == HostLost
		})
	}
	// a and b still write and read the R3 bucket with one node down.
	waitFor(t, 10*time.Second, "a's and b's heartbeats advance with c down", func() bool {
		hosts, err := regs[1].List(ctx)
		if err != nil {
			return false
		}
		n := 0
		for _, h := range hosts {
			if (h.ID == "a" || h.ID == "b") && h.State == HostReady && h.Heartbeat.After(before[h.ID]) {
				n++
			}
		}
		return n == 2
	})
}

// TestRouteAuthRequired proves a cluster node refuses a route that does
// not present the fleet secret: it speaks the route protocol to node a's
// route port with a wrong password and with none.
func TestRouteAuthRequired(t *testing.T) {
	nodes := startCluster(t)
	addr := nodes[0].RouteAddr()
	for _, connect := range []string{
		`CONNECT {"verbose":false,"pedantic":false,"user":"` + routeUser + `","pass":"wrong-secret","name":"intruder","cluster":"test"}`,
		`CONNECT {"verbose":false,"pedantic":false,"name":"intruder","cluster":"test"}`,
	} {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		info, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(info, "INFO ") {
			t.Fatalf("route port greeting %q, %v", info, err)
		}
		if _, err := c.Write([]byte(connect + "\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				break
			}
			got = append(got, strings.TrimSpace(line))
			if strings.HasPrefix(line, "PONG") {
				t.Fatalf("route accepted without the secret (%s): %q", connect, got)
			}
		}
		c.Close()
		if !strings.Contains(strings.Join(got, "\n"), "Authorization Violation") {
			t.Fatalf("route without the secret: answers %q, want an authorization violation", got)
		}
	}
}

func TestCompatible(t *testing.T) {
	for _, c := range []struct {
		mine, other string
		want        bool
	}{
		{"v1.4.2", "v1.4.0", true},
		{"v1.4.2", "1.4.7+abc", true},
		{"v1.4.2", "v1.4.0-rc1", true},
		{"v1.4.2", "v1.5.0", false},
		{"v1.4.2", "v2.4.2", false},
		{"dev", "dev", true},
		{"dev+3f2a1b9c", "dev+3f2a1b9c", true},
		{"dev+3f2a1b9c", "dev+00000000", false},
		{"dev", "v1.4.2", false},
		{"v1.04.2", "v1.4.2", false},
		{"", "", false},
	} {
		if got := Compatible(c.mine, c.other); got != c.want {
			t.Errorf("Compatible(%q, %q) = %v, want %v", c.mine, c.other, got, c.want)
		}
	}
}

// TestExistingNATS proves --nats: the fleet uses a NATS server it did not
// start (here one listening on a loopback port with a user and password),
// with one replica since that server is not clustered; a URL that does
// not answer fails the start as unavailable.
func TestExistingNATS(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true, Username: "fb", Password: "pw-for-the-test"})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	url := "nats://fb:pw-for-the-test@" + srv.Addr().String()
	ctx := context.Background()
	f, err := Start(ctx, Options{URL: url, NodeID: "x1"}, quietLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Replicas() != 1 {
		t.Fatalf("replicas %d on an unclustered server, want 1", f.Replicas())
	}
	r, err := OpenRegistry(ctx, f, RegistryOptions{Version: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Put(ctx, Host{ID: "x1", Version: "dev"}); err != nil {
		t.Fatal(err)
	}
	if hosts, err := r.List(ctx); err != nil || len(hosts) != 1 || !hosts[0].Placeable {
		t.Fatalf("hosts %+v %v", hosts, err)
	}
	if _, err := Start(ctx, Options{URL: "nats://127.0.0.1:1", NodeID: "x2"}, quietLog(t)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a URL that does not answer: %v, want unavailable", err)
	}
}

// TestClusterPortTaken proves a cluster node whose --fleet-listen port is
// taken fails to start (and leaves no server running) instead of serving
// without routes.
func TestClusterPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = Start(context.Background(), Options{StoreDir: t.TempDir(), Cluster: "test", NodeID: "a",
		Listen: ln.Addr().String(), Peers: []Peer{{"b", "127.0.0.1:1"}}, Secret: testSecret}, quietLog(t))
	if err == nil || !strings.Contains(err.Error(), "embedded NATS server") {
		t.Fatalf("start on a taken route port: %v, want the server's error", err)
	}
}
