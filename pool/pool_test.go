package pool

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
)

// TestDepth: a pool fills to its size with live members, never making
// more than fillers at once, and reports ready and starting members.
func TestDepth(t *testing.T) {
	c := newProcCore(t)
	c.hold = make(chan struct{})
	ps, st := newPools(t, c)
	got, err := ps.SetPool(context.Background(), node.Pool{Template: "sleep", Size: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got.Size != 5 || got.CPU != 1 || got.MemoryMB != 512 {
		t.Fatalf("SetPool = %+v, want size 5 with the create defaults (cpu 1, 512 MiB)", got)
	}
	waitFor(t, "two members starting", func() bool { return status(ps, "sleep").Starting == fillers })
	if !ps.Filling() {
		t.Fatal("Filling is false while members are being made")
	}
	close(c.hold)
	waitFor(t, "five ready members", func() bool { return status(ps, "sleep").Ready == 5 })
	if s := status(ps, "sleep"); s.Starting != 0 {
		t.Fatalf("%d starting once full, want 0", s.Starting)
	}
	if n := len(c.alive()); n != 5 {
		t.Fatalf("%d member processes alive, want 5", n)
	}
	if c.maxStarting > fillers {
		t.Fatalf("%d members made at once, want at most %d", c.maxStarting, fillers)
	}
	if d := ps.PoolDepths(); d["sleep"] != 5 {
		t.Fatalf("PoolDepths = %v, want sleep: 5", d)
	}
	// The configuration is stored, with the normalized limits.
	cfgs, err := st.ListPools(context.Background())
	if err != nil || len(cfgs) != 1 || cfgs[0].Size != 5 || cfgs[0].MemoryMB != 512 {
		t.Fatalf("stored pools %v (%v), want one of size 5", cfgs, err)
	}
}

// TestClaim: a fitting create takes the oldest ready member, which is
// replaced; one that does not fit takes none; a member the request proves
// wrong is torn down and the request's error returned.
func TestClaim(t *testing.T) {
	c := newProcCore(t)
	ps, _ := newPools(t, c)
	ctx := context.Background()
	if _, err := ps.SetPool(ctx, node.Pool{Template: "sleep", Size: 2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two ready members", func() bool { return status(ps, "sleep").Ready == 2 })
	before := c.alive()
	spec := node.CreateSpec{Template: "sleep", CPU: 1, MemoryMB: 512, Isolation: "proc"}
	rec, err := ps.Claim(ctx, spec, "key", "hash")
	if err != nil || rec == nil {
		t.Fatalf("Claim = %v, %v; want a session", rec, err)
	}
	if !before[rec.ID] || rec.IdempotencyKey != "key" || rec.RequestHash != "hash" {
		t.Fatalf("claimed %+v, want one of the ready members %v with the create's key and hash", rec, before)
	}
	waitFor(t, "the pool refilled", func() bool { return status(ps, "sleep").Ready == 2 })
	if n := c.launched("sleep"); n != 3 {
		t.Fatalf("%d launches, want 3 (two, and one replacement)", n)
	}
	for _, miss := range []node.CreateSpec{
		{Template: "sleep", CPU: 2, MemoryMB: 512, Isolation: "proc"},                // other limits
		{Template: "sleep", CPU: 1, MemoryMB: 512, Isolation: "other"},               // other driver
		{Template: "sleep", CPU: 1, MemoryMB: 512, Isolation: "proc", Snapshot: "s"}, // from a snapshot
		{Template: "sleep", CPU: 1, MemoryMB: 512, Isolation: "proc", Network: &node.Network{}},
		{Template: "missing", CPU: 1, MemoryMB: 512, Isolation: "proc"}, // no pool
	} {
		if rec, err := ps.Claim(ctx, miss, "", ""); rec != nil || err != nil {
			t.Fatalf("Claim(%+v) = %v, %v; want no member and no error", miss, rec, err)
		}
	}
	if s := status(ps, "sleep"); s.Ready != 2 {
		t.Fatalf("%d ready after creates that do not fit, want 2", s.Ready)
	}
	bad := spec
	bad.User = "nobody-here"
	rec, err = ps.Claim(ctx, bad, "", "")
	if errdefs.Field(err) != "user" || rec != nil {
		t.Fatalf("Claim with an unknown user = %v, %v; want the user field error", rec, err)
	}
	waitFor(t, "the wrong member torn down and replaced", func() bool {
		return status(ps, "sleep").Ready == 2 && len(c.alive()) == 2 && c.launched("sleep") == 4
	})
}

// TestClaimSkipsDeadMember: a member whose process died is torn down and
// the next one handed out.
func TestClaimSkipsDeadMember(t *testing.T) {
	c := newProcCore(t)
	ps, _ := newPools(t, c)
	ctx := context.Background()
	if _, err := ps.SetPool(ctx, node.Pool{Template: "sleep", Size: 2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two ready members", func() bool { return status(ps, "sleep").Ready == 2 })
	ps.mu.Lock()
	oldest := ps.pools["sleep"].ready[0]
	ps.mu.Unlock()
	c.mu.Lock()
	cmd := c.procs[oldest]
	c.mu.Unlock()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	rec, err := ps.Claim(ctx, node.CreateSpec{Template: "sleep", CPU: 1, MemoryMB: 512, Isolation: "proc"}, "", "")
	if err != nil || rec == nil || rec.ID == oldest {
		t.Fatalf("Claim = %v, %v; want the member after the dead %s", rec, err, oldest)
	}
	waitFor(t, "the dead member discarded", func() bool { return !c.alive()[oldest] && c.procs[oldest] == nil })
}

// TestShrinkAndLimits: a smaller size tears down the members beyond it; a
// change of limits tears down every member and makes new ones; size 0
// empties the pool.
func TestShrinkAndLimits(t *testing.T) {
	c := newProcCore(t)
	ps, _ := newPools(t, c)
	ctx := context.Background()
	if _, err := ps.SetPool(ctx, node.Pool{Template: "sleep", Size: 4}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "four ready members", func() bool { return status(ps, "sleep").Ready == 4 })
	if _, err := ps.SetPool(ctx, node.Pool{Template: "sleep", Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "three members torn down", func() bool { return len(c.alive()) == 1 })
	if s := status(ps, "sleep"); s.Ready != 1 || c.launched("sleep") != 4 {
		t.Fatalf("after shrinking: %+v with %d launches, want 1 ready and no new launch", s, c.launched("sleep"))
	}
	old := c.alive()
	if _, err := ps.SetPool(ctx, node.Pool{Template: "sleep", Size: 1, MemoryMB: 1024}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a member with the new limits", func() bool {
		alive := c.alive()
		for id := range old {
			if alive[id] {
				return false
			}
		}
		return len(alive) == 1 && status(ps, "sleep").Ready == 1
	})
	for id := range c.alive() {
		if id[len(id)-5:] != "-1024" {
			t.Fatalf("member %s was made for other limits than 1024 MiB", id)
		}
	}
	if _, err := ps.SetPool(ctx, node.Pool{Template: "sleep", Size: 0}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pool emptied", func() bool { return len(c.alive()) == 0 })
}

// TestBackOff: a pool whose members keep failing stops after maxFailures
// launches in a row and tries once more per tick.
func TestBackOff(t *testing.T) {
	c := newProcCore(t)
	ps, _ := newPools(t, c)
	if _, err := ps.SetPool(context.Background(), node.Pool{Template: "missing", Size: 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the failures to stop the pool", func() bool {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		return ps.pools["missing"].failures >= maxFailures && ps.pools["missing"].starting == 0
	})
	// (fills run fillers at a time, so the ones under way when the last
	// allowed one failed count too)
	n := c.launched("missing")
	if n < maxFailures || n > maxFailures+fillers-1 {
		t.Fatalf("%d launches before backing off, want %d to %d", n, maxFailures, maxFailures+fillers-1)
	}
	// A kick (as a claim or SetPool of another pool gives) does not retry.
	ps.wake()
	time.Sleep(100 * time.Millisecond)
	if got := c.launched("missing"); got != n {
		t.Fatalf("%d launches after a kick while backed off, want %d", got, n)
	}
	waitFor(t, "one more try at the next tick", func() bool { return c.launched("missing") > n })
	waitFor(t, "the retry to end", func() bool { return !ps.Filling() })
	if got := c.launched("missing"); got > n+fillers {
		t.Fatalf("%d launches after one tick, want at most %d", got, n+fillers)
	}
	if s := status(ps, "missing"); s.Ready != 0 || s.Starting != 0 {
		t.Fatalf("failing pool reports %+v, want nothing ready or starting", s)
	}
}

// TestHaltAndDrop: halted pools make no member and tear down one that was
// being made; a dropped pool's members go and its size is stored as 0.
func TestHaltAndDrop(t *testing.T) {
	c := newProcCore(t)
	c.hold = make(chan struct{})
	ps, _ := newPools(t, c)
	ctx := context.Background()
	if _, err := ps.SetPool(ctx, node.Pool{Template: "sleep", Size: 2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "members starting", func() bool { return status(ps, "sleep").Starting == 2 })
	ps.Halt()
	close(c.hold)
	waitFor(t, "the members being made to be torn down", func() bool { return !ps.Filling() && len(c.alive()) == 0 })
	if s := status(ps, "sleep"); s.Ready != 0 || c.launched("sleep") != 2 {
		t.Fatalf("halted pool: %+v after %d launches, want nothing ready and no new launch", s, c.launched("sleep"))
	}

	c2 := newProcCore(t)
	ps2, st2 := newPools(t, c2)
	if _, err := ps2.SetPool(ctx, node.Pool{Template: "sleep", Size: 2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two ready members", func() bool { return status(ps2, "sleep").Ready == 2 })
	ps2.Drop("sleep")
	waitFor(t, "the dropped pool's members torn down", func() bool { return len(c2.alive()) == 0 })
	if len(ps2.PoolList()) != 0 {
		t.Fatalf("pools after Drop: %v, want none", ps2.PoolList())
	}
	cfgs, err := st2.ListPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range cfgs {
		if p.Size != 0 {
			t.Fatalf("stored pool after Drop: %+v, want size 0", *p)
		}
	}
}

// TestLoad: pools stored by a previous daemon are refilled by the next.
func TestLoad(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.PutPool(context.Background(), &node.Pool{Template: "sleep", Size: 2, CPU: 1, MemoryMB: 512}); err != nil {
		t.Fatal(err)
	}
	c := newProcCore(t)
	ps := New(Options{Core: c, Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer ps.Close()
	if err := ps.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stored pool refilled", func() bool { return status(ps, "sleep").Ready == 2 })
}

// TestSetPoolRefuses: bad sizes, limits and templates are refused naming
// the field, and nothing is stored.
func TestSetPoolRefuses(t *testing.T) {
	c := newProcCore(t)
	ps, st := newPools(t, c)
	ctx := context.Background()
	for _, tc := range []struct {
		p     node.Pool
		field string
	}{
		{node.Pool{Template: "sleep", Size: -1}, "size"},
		{node.Pool{Template: "sleep", Size: MaxSize + 1}, "size"},
		{node.Pool{Template: "sleep", Size: 1, CPU: 9}, "cpu"},
		{node.Pool{Template: "nonesuch", Size: 1}, "template"},
	} {
		_, err := ps.SetPool(ctx, tc.p)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != tc.field {
			t.Fatalf("SetPool(%+v) = %v, want an invalid %s", tc.p, err, tc.field)
		}
	}
	if cfgs, _ := st.ListPools(ctx); len(cfgs) != 0 || len(ps.PoolList()) != 0 {
		t.Fatalf("refused pools were kept: %v %v", cfgs, ps.PoolList())
	}
}

// TestCloseWaitsForFill: Close returns only once the members being made
// are (the daemon closes the core, the store and the storage after it).
func TestCloseWaitsForFill(t *testing.T) {
	c := newProcCore(t)
	c.hold = make(chan struct{})
	ps, _ := newPools(t, c)
	if _, err := ps.SetPool(context.Background(), node.Pool{Template: "sleep", Size: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a member starting", func() bool { return status(ps, "sleep").Starting == 1 })
	closed := make(chan struct{})
	go func() { ps.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a member was being made")
	case <-time.After(200 * time.Millisecond):
	}
	close(c.hold)
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return after the member was made")
	}
}

// TestSpares: the spares fill to their number beside the template pools
// (which do not list them), each is handed out once and replaced, and
// none is handed out when none is ready; Halt forgets them.
func TestSpares(t *testing.T) {
	c := newProcCore(t)
	ps, _ := newPoolsSpares(t, c, 3)
	waitFor(t, "three spares", func() bool { r, _ := ps.Spares(); return r == 3 })
	if l := ps.PoolList(); len(l) != 0 {
		t.Fatalf("PoolList lists the spares: %+v", l)
	}
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		waitFor(t, "a ready spare", func() bool { r, _ := ps.Spares(); return r > 0 })
		id := ps.TakeSpare()
		if id == "" || seen[id] || !c.alive()[id] {
			t.Fatalf("take %d: %q (seen before: %v)", i, id, seen[id])
		}
		seen[id] = true
	}
	waitFor(t, "the spares refilled", func() bool { r, _ := ps.Spares(); return r == 3 })
	ps.Halt()
	if id := ps.TakeSpare(); id != "" {
		t.Fatalf("a halted pool handed out spare %s", id)
	}
	if n := c.launched("sleep"); n != 9 {
		t.Fatalf("%d spares launched, want 9 (3, and one for each of the 6 taken)", n)
	}
}
