package fleet

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
)

// TestLostWatcherAndReconcile marks the sessions of a host whose
// heartbeat stopped terminated (host-lost) on a real embedded JetStream,
// answers them as ended to a caller of their tenant only, leaves other
// hosts' sessions and the lost host's snapshots alone, and reconciles the
// host when it comes back: the sandboxes the fleet gave up on destroyed
// and their entries removed, an entry written live since kept.
func TestLostWatcherAndReconcile(t *testing.T) {
	f := startAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := OpenRegistry(ctx, f, RegistryOptions{Heartbeat: 100 * time.Millisecond, LostAfter: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := reg.Put(ctx, Host{ID: id, Load: Load{Sessions: 2, Pooled: 3}}); err != nil {
			t.Fatal(err)
		}
	}
	put := func(l Location) {
		t.Helper()
		if err := dir.Put(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	put(Location{Kind: KindSession, ID: "b1aaaaaaaaaaaaaaaaaa", Host: "b", Tenant: "t1"})
	put(Location{Kind: KindSession, ID: "b2aaaaaaaaaaaaaaaaaa", Host: "b"})
	put(Location{Kind: KindSession, ID: "a1aaaaaaaaaaaaaaaaaa", Host: "a"})
	put(Location{Kind: KindSnapshot, ID: "n1aaaaaaaaaaaaaaaaaa", Host: "b", Replicated: true})

	// a keeps beating; b stopped. a's watcher never marks a itself.
	hb, stop := context.WithCancel(ctx)
	defer stop()
	go reg.Run(hb, func() Host { return Host{ID: "a"} })
	w := NewLostWatcher(reg, dir, "a", quietLog(t))
	if m, err := w.Sweep(ctx); err != nil || len(m) != 0 {
		t.Fatalf("sweep before b is lost: %v, %v; want nothing marked", m, err)
	}
	waitFor(t, 10*time.Second, "b listed lost", func() bool {
		hs, err := reg.List(ctx)
		if err != nil {
			return false
		}
		for _, h := range hs {
			if h.ID == "b" {
				if h.State == HostLost && h.Load.Pooled != 0 {
					t.Fatalf("lost host b lists %d pooled members, want them forgotten", h.Load.Pooled)
				}
				return h.State == HostLost && !h.Placeable
			}
		}
		return false
	})
	// a's own heartbeats must have succeeded for a LostAfter first.
	var m map[string][]Location
	waitFor(t, 10*time.Second, "a's watcher marks b's sessions", func() bool {
		m, err = w.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(m) > 0
	})
	if got := ids(m["b"]); strings.Join(got, ",") != "b1aaaaaaaaaaaaaaaaaa,b2aaaaaaaaaaaaaaaaaa" || len(m) != 1 {
		t.Fatalf("marked %v, want b's two sessions", m)
	}
	for _, l := range m["b"] {
		got, err := dir.Get(ctx, KindSession, l.ID)
		if err != nil || got.State != LocationTerminated || got.Reason != ReasonHostLost {
			t.Fatalf("entry %s: %+v, %v; want terminated host-lost", l.ID, got, err)
		}
	}
	if l, _ := dir.Get(ctx, KindSession, "a1aaaaaaaaaaaaaaaaaa"); l.State != "" {
		t.Fatalf("a's session was marked: %+v", l)
	}
	if l, _ := dir.Get(ctx, KindSnapshot, "n1aaaaaaaaaaaaaaaaaa"); l.State != "" {
		t.Fatalf("b's replicated snapshot was marked: %+v", l)
	}
	// A second sweep within LostAfter does not scan b again.
	if m, err := w.Sweep(ctx); err != nil || len(m) != 0 {
		t.Fatalf("second sweep: %v, %v; want nothing", m, err)
	}

	only := func(tenant string) func(string) bool { return func(t string) bool { return t == tenant } }
	if err := dir.Ended(ctx, "b1aaaaaaaaaaaaaaaaaa", only("t1")); !errors.Is(err, errdefs.ErrTerminated) || !strings.Contains(err.Error(), "(host-lost)") {
		t.Fatalf("Ended(b1) for its tenant = %v, want terminated (host-lost)", err)
	}
	if err := dir.Ended(ctx, "b1aaaaaaaaaaaaaaaaaa", only("t2")); err != nil {
		t.Fatalf("Ended(b1) for another tenant = %v, want nil (nothing told)", err)
	}
	for _, id := range []string{"a1aaaaaaaaaaaaaaaaaa", "zzaaaaaaaaaaaaaaaaaa", "NOT-AN-ID"} {
		if err := dir.Ended(ctx, id, nil); err != nil {
			t.Fatalf("Ended(%s) = %v, want nil", id, err)
		}
	}

	// b comes back. Meanwhile one of its sessions was made again live
	// (a live entry is never destroyed).
	put(Location{Kind: KindSession, ID: "b3aaaaaaaaaaaaaaaaaa", Host: "b"})
	var mu sync.Mutex
	var destroyed []string
	failed := false
	destroy := func(_ context.Context, id string) error {
		mu.Lock()
		defer mu.Unlock()
		if id == "b2aaaaaaaaaaaaaaaaaa" && !failed {
			failed = true
			return errdefs.Newf(errdefs.ErrUnavailable, "teardown failed")
		}
		destroyed = append(destroyed, id)
		if id == "b1aaaaaaaaaaaaaaaaaa" {
			return errdefs.Newf(errdefs.ErrNotFound, "session %s", id) // not on the host: only the entry goes
		}
		return nil
	}
	// The first try fails on b2 (whichever order): what is not done stays.
	for try := 0; ; try++ {
		_, err := Reconcile(ctx, dir, "b", destroy)
		if err == nil {
			sort.Strings(destroyed)
			if strings.Join(destroyed, ",") != "b1aaaaaaaaaaaaaaaaaa,b2aaaaaaaaaaaaaaaaaa" {
				t.Fatalf("destroyed %v, want b1 and b2", destroyed)
			}
			if try == 0 {
				t.Fatal("the failing destroy did not fail Reconcile")
			}
			break
		}
		if !errors.Is(err, errdefs.ErrUnavailable) || try > 0 {
			t.Fatalf("reconcile try %d: %v", try, err)
		}
		if _, gerr := dir.Get(ctx, KindSession, "b2aaaaaaaaaaaaaaaaaa"); gerr != nil {
			t.Fatalf("b2's entry went though its destroy failed: %v", gerr)
		}
	}
	for _, id := range []string{"b1aaaaaaaaaaaaaaaaaa", "b2aaaaaaaaaaaaaaaaaa"} {
		if _, err := dir.Get(ctx, KindSession, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("entry of %s after reconcile: %v, want removed", id, err)
		}
	}
	if l, err := dir.Get(ctx, KindSession, "b3aaaaaaaaaaaaaaaaaa"); err != nil || l.State != "" {
		t.Fatalf("b's live entry after reconcile: %+v, %v; want kept", l, err)
	}
}

func ids(ls []Location) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.ID)
	}
	sort.Strings(out)
	return out
}

// TestLostWatchersRace runs the watchers of two hosts of a three-node
// JetStream cluster at once against the sessions of a third, lost host:
// every session is marked, and by one watcher only (compare-and-set).
func TestLostWatchersRace(t *testing.T) {
	nodes := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := RegistryOptions{Heartbeat: 100 * time.Millisecond, LostAfter: 500 * time.Millisecond}
	var regs []*Registry
	var dirs []*Directory
	for _, f := range nodes[:2] {
		r, err := OpenRegistry(ctx, f, opts)
		if err != nil {
			t.Fatal(err)
		}
		d, err := OpenDirectory(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		regs, dirs = append(regs, r), append(dirs, d)
	}
	if err := regs[0].Put(ctx, Host{ID: "c"}); err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		if err := dirs[0].Put(ctx, Location{Kind: KindSession, ID: fmt.Sprintf("c%019d", i), Host: "c"}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "c lost on both", func() bool {
		for _, r := range regs {
			hs, err := r.List(ctx)
			if err != nil || len(hs) != 1 || hs[0].State != HostLost {
				return false
			}
		}
		return true
	})
	var wg sync.WaitGroup
	got := make([][]Location, 2)
	for i := range 2 {
		w := NewLostWatcher(regs[i], dirs[i], nodes[i].NodeID(), quietLog(t))
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := w.Sweep(ctx)
			if err != nil {
				t.Error(err)
			}
			got[i] = m["c"]
		}()
	}
	wg.Wait()
	seen := map[string]int{}
	for _, ls := range got {
		for _, l := range ls {
			seen[l.ID]++
		}
	}
	if len(seen) != n {
		t.Fatalf("%d sessions marked, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("session %s marked by %d watchers, want 1", id, c)
		}
	}
}

// TestDrain sets and clears a host's drain flag: the registry lists it
// draining and not placeable at once, the host's own heartbeat writes it
// draining, a lost host stays lost, and an unknown host is not found.
func TestDrain(t *testing.T) {
	f := startAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := OpenRegistry(ctx, f, RegistryOptions{Heartbeat: 100 * time.Millisecond, LostAfter: 400 * time.Millisecond, Version: "v1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	state := func(id string) (HostState, bool) {
		t.Helper()
		hs, err := reg.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			if h.ID == id {
				return h.State, h.Placeable
			}
		}
		t.Fatalf("host %s not listed", id)
		return "", false
	}
	for _, id := range []string{"a", "b"} {
		if err := reg.Put(ctx, Host{ID: id, Version: "v1.0.0"}); err != nil {
			t.Fatal(err)
		}
	}
	if s, p := state("a"); s != HostReady || !p {
		t.Fatalf("a before drain: %s placeable %v, want ready, placeable", s, p)
	}
	if err := reg.Drain(ctx, "zz", true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("drain of an unknown host: %v, want not found", err)
	}
	if err := reg.Drain(ctx, "Bad Id", true); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("drain of a bad id: %v, want invalid argument", err)
	}
	for range 2 { // twice: draining a draining host is fine
		if err := reg.Drain(ctx, "a", true); err != nil {
			t.Fatal(err)
		}
	}
	if s, p := state("a"); s != HostDraining || p {
		t.Fatalf("a after drain: %s placeable %v, want draining, not placeable", s, p)
	}
	// a's own heartbeat (its record ready) writes it draining.
	hb, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		reg.Run(hb, func() Host { return Host{ID: "a", State: HostReady, Version: "v1.0.0"} })
	}()
	waitFor(t, 10*time.Second, "a's own record says draining", func() bool {
		e, err := reg.kv.Get(ctx, "a")
		return err == nil && strings.Contains(string(e.Value()), `"state":"draining"`)
	})
	if err := reg.Drain(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	if s, p := state("a"); s != HostReady || !p {
		t.Fatalf("a after undrain: %s placeable %v, want ready, placeable", s, p)
	}
	waitFor(t, 10*time.Second, "a's own record says ready", func() bool {
		e, err := reg.kv.Get(ctx, "a")
		return err == nil && strings.Contains(string(e.Value()), `"state":"ready"`)
	})
	stop()
	<-done
	// b, drained and then silent, is lost: lost wins over draining.
	if err := reg.Drain(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "b lost", func() bool { s, _ := state("b"); return s == HostLost })
}

// TestRejoinAfterCut cuts host c off from the quorum (the two other
// nodes of a three-node JetStream cluster stopped) while its heartbeat
// runs on; the others come back, list c lost and terminate its session;
// c's registry then reconciles (Rejoin) before it writes its record again:
// c stays listed lost until the session is destroyed and its entry gone.
func TestRejoinAfterCut(t *testing.T) {
	ids := []string{"a", "b", "c"}
	ports := freePorts(t, 3)
	stores := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	start := func(i int) *Fleet {
		t.Helper()
		var peers []Peer
		for j, p := range ids {
			if j != i {
				peers = append(peers, Peer{ID: p, Addr: fmt.Sprintf("127.0.0.1:%d", ports[j])})
			}
		}
		f, err := Start(context.Background(), Options{StoreDir: stores[i], Cluster: "test", NodeID: ids[i], Peers: peers,
			Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Secret: testSecret}, quietLog(t).With("node", ids[i]))
		if err != nil {
			t.Fatalf("node %s: %v", ids[i], err)
		}
		t.Cleanup(f.Close)
		return f
	}
	nodes := []*Fleet{start(0), start(1), start(2)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const session = "c1aaaaaaaaaaaaaaaaaa"
	dirC, err := OpenDirectory(ctx, nodes[2])
	if err != nil {
		t.Fatal(err)
	}
	if err := dirC.Put(ctx, Location{Kind: KindSession, ID: session, Host: "c"}); err != nil {
		t.Fatal(err)
	}
	marked := make(chan struct{})
	var mu sync.Mutex
	var destroyed []string
	opts := RegistryOptions{Heartbeat: 100 * time.Millisecond, LostAfter: 800 * time.Millisecond}
	copts := opts
	copts.Rejoin = func(ctx context.Context) error {
		select {
		case <-marked:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := Reconcile(ctx, dirC, "c", func(_ context.Context, id string) error {
			mu.Lock()
			defer mu.Unlock()
			destroyed = append(destroyed, id)
			return nil
		})
		return err
	}
	regC, err := OpenRegistry(ctx, nodes[2], copts)
	if err != nil {
		t.Fatal(err)
	}
	hb, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); regC.Run(hb, func() Host { return Host{ID: "c"} }) }()
	defer func() { stop(); <-done }()
	waitFor(t, 20*time.Second, "c's record written", func() bool {
		_, err := regC.kv.Get(ctx, "c")
		return err == nil
	})

	nodes[0].Close()
	nodes[1].Close()
	time.Sleep(2 * opts.LostAfter)
	nodes[0], nodes[1] = start(0), start(1)
	regA, err := OpenRegistry(ctx, nodes[0], opts)
	if err != nil {
		t.Fatal(err)
	}
	dirA, err := OpenDirectory(ctx, nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	w := NewLostWatcher(regA, dirA, "a", quietLog(t))
	waitFor(t, 30*time.Second, "a's watcher terminates c's session", func() bool {
		m, _ := w.Sweep(ctx)
		return len(m["c"]) == 1
	})
	// c's Rejoin waits: its record must not have been written since.
	hs, err := regA.List(ctx)
	if err != nil || len(hs) != 1 || hs[0].State != HostLost {
		t.Fatalf("a lists %+v, %v while c's rejoin waits; want c lost", hs, err)
	}
	close(marked)
	waitFor(t, 30*time.Second, "a lists c ready again", func() bool {
		hs, err := regA.List(ctx)
		return err == nil && len(hs) == 1 && hs[0].State == HostReady
	})
	mu.Lock()
	defer mu.Unlock()
	if len(destroyed) != 1 || destroyed[0] != session {
		t.Fatalf("c destroyed %v on rejoining, want %s", destroyed, session)
	}
	if _, err := dirA.Get(ctx, KindSession, session); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("entry of c's session after c rejoined: %v, want removed", err)
	}
}

// TestLostWatcherGrace starts a watcher while another host's record is
// already older than LostAfter (a fleet coming back together): Run marks
// nothing during its first LostAfter, then marks that host's sessions.
func TestLostWatcherGrace(t *testing.T) {
	f := startAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := OpenRegistry(ctx, f, RegistryOptions{Heartbeat: 100 * time.Millisecond, LostAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Put(ctx, Host{ID: "b"}); err != nil {
		t.Fatal(err)
	}
	const id = "b1aaaaaaaaaaaaaaaaaa"
	if err := dir.Put(ctx, Location{Kind: KindSession, ID: id, Host: "b"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "b listed lost", func() bool {
		hs, err := reg.List(ctx)
		return err == nil && len(hs) == 1 && hs[0].State == HostLost
	})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); NewLostWatcher(reg, dir, "a", quietLog(t)).Run(wctx, 0) }()
	defer func() { stop(); <-done }()
	time.Sleep(500 * time.Millisecond)
	if l, err := dir.Get(ctx, KindSession, id); err != nil || l.State != "" {
		t.Fatalf("b's session within the watcher's first LostAfter: %+v, %v; want live", l, err)
	}
	waitFor(t, 15*time.Second, "b's session marked host-lost", func() bool {
		l, err := dir.Get(ctx, KindSession, id)
		return err == nil && l.Reason == ReasonHostLost
	})
}

// Registry.Live leaves out a host whose record is older than LostAfter,
// but only once this host's own heartbeats have succeeded for a whole
// LostAfter: before that (a fleet coming back after a quorum loss, every
// record old alike) it is ErrUnavailable, so nobody drops a live host's
// quota counts.
func TestRegistryLive(t *testing.T) {
	f := startAlone(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := OpenRegistry(ctx, f, RegistryOptions{Heartbeat: 100 * time.Millisecond, LostAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := reg.Put(ctx, Host{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "a and b listed lost", func() bool {
		hs, err := reg.List(ctx)
		return err == nil && len(hs) == 2 && hs[0].State == HostLost && hs[1].State == HostLost
	})
	hb, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); reg.Run(hb, func() Host { return Host{ID: "a"} }) }()
	defer func() { stop(); <-done }()
	waitFor(t, 10*time.Second, "a's heartbeat written", func() bool {
		hs, err := reg.List(ctx)
		return err == nil && len(hs) == 2 && hs[0].State == HostReady
	})
	if live, err := reg.Live(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("live hosts within a's first LostAfter of heartbeats: %v, %v; want ErrUnavailable", live, err)
	}
	waitFor(t, 10*time.Second, "the live hosts once a's heartbeats settled", func() bool {
		live, err := reg.Live(ctx)
		return err == nil && len(live) == 1 && live["a"]
	})
}

// TestRejoinSecondPass: a watcher that listed host c lost marks c's
// session just after c's rejoin reconciled (its first pass found nothing
// to destroy): the second pass Run makes a LostAfter later destroys it,
// so the session does not run on, leaked, under an entry the fleet gave
// up on.
func TestRejoinSecondPass(t *testing.T) {
	ids := []string{"a", "b", "c"}
	ports := freePorts(t, 3)
	stores := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	start := func(i int) *Fleet {
		t.Helper()
		var peers []Peer
		for j, p := range ids {
			if j != i {
				peers = append(peers, Peer{ID: p, Addr: fmt.Sprintf("127.0.0.1:%d", ports[j])})
			}
		}
		f, err := Start(context.Background(), Options{StoreDir: stores[i], Cluster: "test", NodeID: ids[i], Peers: peers,
			Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Secret: testSecret}, quietLog(t).With("node", ids[i]))
		if err != nil {
			t.Fatalf("node %s: %v", ids[i], err)
		}
		t.Cleanup(f.Close)
		return f
	}
	nodes := []*Fleet{start(0), start(1), start(2)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const session = "c1aaaaaaaaaaaaaaaaaa"
	dirC, err := OpenDirectory(ctx, nodes[2])
	if err != nil {
		t.Fatal(err)
	}
	if err := dirC.Put(ctx, Location{Kind: KindSession, ID: session, Host: "c"}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var destroyed []string
	passes := 0
	firstDone := make(chan struct{})
	// marked: the late watcher's mark is written. A pass after the first
	// waits for it, so the mark lands between the two passes however
	// long the restarted nodes take to serve it.
	marked := make(chan struct{})
	opts := RegistryOptions{Heartbeat: 100 * time.Millisecond, LostAfter: 800 * time.Millisecond}
	opts.Rejoin = func(ctx context.Context) error {
		mu.Lock()
		later := passes > 0
		mu.Unlock()
		if later {
			select {
			case <-marked:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		_, err := Reconcile(ctx, dirC, "c", func(_ context.Context, id string) error {
			mu.Lock()
			defer mu.Unlock()
			destroyed = append(destroyed, id)
			return nil
		})
		if err == nil {
			mu.Lock()
			if passes++; passes == 1 {
				close(firstDone)
			}
			mu.Unlock()
		}
		return err
	}
	regC, err := OpenRegistry(ctx, nodes[2], opts)
	if err != nil {
		t.Fatal(err)
	}
	hb, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); regC.Run(hb, func() Host { return Host{ID: "c"} }) }()
	defer func() { stop(); <-done }()
	waitFor(t, 20*time.Second, "c's record written", func() bool {
		_, err := regC.kv.Get(ctx, "c")
		return err == nil
	})

	nodes[0].Close()
	nodes[1].Close()
	time.Sleep(2 * opts.LostAfter)
	nodes[0], nodes[1] = start(0), start(1)
	select {
	case <-firstDone:
	case <-ctx.Done():
		t.Fatal("c never rejoined")
	}
	// The late watcher's mark, after c's first pass.
	dirA, err := OpenDirectory(ctx, nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := markLost(ctx, dirA, map[string]bool{"c": true}); err != nil {
		t.Fatal(err)
	}
	close(marked)
	waitFor(t, 30*time.Second, "c's session destroyed by the second pass", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(destroyed) == 1 && destroyed[0] == session
	})
	waitFor(t, 10*time.Second, "its entry removed", func() bool {
		_, err := dirA.Get(ctx, KindSession, session)
		return errors.Is(err, errdefs.ErrNotFound)
	})
}

// TestReplicasCurrent: a stream is current when it has a leader and every
// replica is caught up, where a replica NATS reports offline, or one the
// leader has not heard from for replicaSilent (a killed server, before
// NATS calls it offline), is left out, but never this host's own.
func TestReplicasCurrent(t *testing.T) {
	info := func(leader string, rs ...*jetstream.PeerInfo) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{Cluster: &jetstream.ClusterInfo{Leader: leader, Replicas: rs}}
	}
	current := &jetstream.PeerInfo{Name: "b", Current: true, Active: 200 * time.Millisecond}
	lagging := &jetstream.PeerInfo{Name: "b", Current: true, Lag: 3, Active: 200 * time.Millisecond}
	killed := &jetstream.PeerInfo{Name: "c", Active: 40 * time.Second}
	offline := &jetstream.PeerInfo{Name: "c", Offline: true}
	for _, tc := range []struct {
		name string
		si   *jetstream.StreamInfo
		node string
		want bool
	}{
		{"alone", &jetstream.StreamInfo{}, "a", true},
		{"no leader", info("", current), "a", false},
		{"caught up", info("a", current), "a", true},
		{"lagging", info("a", lagging), "a", false},
		{"offline left out", info("a", current, offline), "a", true},
		{"silent left out", info("a", current, killed), "a", true},
		{"own silent replica waited for", info("a", current, killed), "c", false},
		{"silent but heard of just now", info("a", &jetstream.PeerInfo{Name: "c", Active: time.Second}), "a", false},
	} {
		if got := replicasCurrent(tc.si, tc.node); got != tc.want {
			t.Errorf("%s: replicasCurrent = %v, want %v", tc.name, got, tc.want)
		}
	}
}
