package fleetstate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
)

func openQuotas(t *testing.T, hosts []*host) []*Quotas {
	t.Helper()
	out := make([]*Quotas, len(hosts))
	for i, h := range hosts {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		q, err := OpenQuotas(ctx, h.f, quietLog())
		cancel()
		if err != nil {
			t.Fatalf("host %s: %v", h.id, err)
		}
		out[i] = q
	}
	return out
}

// Twelve creates at once, four on each of three hosts, of a tenant with
// max_sessions 3, through each host's own admission controller and store:
// exactly three are admitted over the fleet, the others get the same 429
// tenant-concurrency-exceeded as on one host. A session ending on one
// host gives its place to a create on another.
func TestFleetMaxSessions(t *testing.T) {
	hosts := startHosts(t)
	qs := openQuotas(t, hosts)
	ctx := context.Background()
	ctls := make([]*admission.Controller, len(hosts))
	for i, h := range hosts {
		if err := h.st.CreateTenant(ctx, &store.Tenant{Name: "acme", Policy: `{"max_sessions":3}`, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		ctls[i] = admission.New(admission.Options{Store: h.st, Fleet: qs[i]})
	}
	var mu sync.Mutex
	var admitted []*admission.Reservation
	refused := 0
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, c := range ctls {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tn, p, err := c.Tenant(ctx, "acme")
				if err != nil {
					t.Error(err)
					return
				}
				<-start
				_, r, err := c.Admit(ctx, tn, p, 64)
				mu.Lock()
				defer mu.Unlock()
				var te *errdefs.TypedError
				switch {
				case err == nil:
					admitted = append(admitted, r)
				case errors.As(err, &te) && te.Type == node.ProblemTenantConcurrency && errors.Is(err, errdefs.ErrResourceExhausted):
					refused++
				default:
					t.Errorf("admit: %v", err)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	if len(admitted) != 3 || refused != 9 {
		t.Fatalf("admitted %d, refused %d of 12: want 3 and 9", len(admitted), refused)
	}
	total, per, err := qs[2].Counts(ctx, "sessions", "acme")
	if err != nil || total != 3 {
		t.Fatalf("fleet count %d (%v), %v: want 3", total, per, err)
	}
	// A fourth anywhere is refused; once one ends, a create on another
	// host is admitted.
	var end *admission.Reservation
	var other int
	for _, r := range admitted {
		for i, c := range ctls {
			if c.TenantSessions("acme") > 0 && end == nil {
				end, other = r, (i+1)%len(ctls)
			}
		}
	}
	tn, p, _ := ctls[other].Tenant(ctx, "acme")
	if _, _, err := ctls[other].Admit(ctx, tn, p, 64); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a fourth session: %v, want refused", err)
	}
	end.Release()
	waitFor(t, 10*time.Second, "the ended session's place in the fleet's count given back", func() bool {
		n, _, _ := qs[0].Counts(ctx, "sessions", "acme")
		return n == 2
	})
	if _, _, err := ctls[other].Admit(ctx, tn, p, 64); err != nil {
		t.Fatalf("a create after one ended: %v", err)
	}
}

// Reconcile drops the counts of hosts no longer live and rewrites this
// host's own from what it holds.
func TestQuotasReconcile(t *testing.T) {
	hosts := startHosts(t)
	qs := openQuotas(t, hosts)
	ctx := context.Background()
	for i, q := range qs {
		n := i + 1
		if _, err := q.Hold(ctx, "sessions", "acme", 10, func() int { return n }, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n, _, _ := qs[0].Counts(ctx, "sessions", "acme"); n != 6 {
		t.Fatalf("fleet count %d, want 6", n)
	}
	// Host a now holds 4; host c is lost.
	err := qs[0].Reconcile(ctx, func(what, tenant string) int { return 4 }, map[string]bool{"a": true, "b": true})
	if err != nil {
		t.Fatal(err)
	}
	n, per, err := qs[1].Counts(ctx, "sessions", "acme")
	if err != nil || n != 6 || per["a"] != 4 || per["b"] != 2 || per["c"] != 0 {
		t.Fatalf("after reconcile: %d %v %v, want a 4, b 2, no c", n, per, err)
	}
	if _, err := qs[1].Hold(ctx, "sessions", "acme", 6, func() int { return 3 }, nil); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a hold past the limit: %v, want ErrResourceExhausted", err)
	}
}

// Snapshots of a tenant with max_snapshots 2, reserved at once on three
// hosts (admission's ReserveQuota, each host counting its own store):
// two places over the fleet, the others refused with 429
// tenant-quota-exceeded; a place given back (a failed snapshot) is
// another host's to take.
func TestFleetMaxSnapshots(t *testing.T) {
	hosts := startHosts(t)
	qs := openQuotas(t, hosts)
	ctx := context.Background()
	ctls := make([]*admission.Controller, len(hosts))
	for i, h := range hosts {
		if err := h.st.CreateTenant(ctx, &store.Tenant{Name: "acme", Policy: `{"max_snapshots":2}`, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		ctls[i] = admission.New(admission.Options{Store: h.st, Fleet: qs[i]})
	}
	var mu sync.Mutex
	var releases []func()
	refused := 0
	var wg sync.WaitGroup
	for _, c := range ctls {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				release, err := c.ReserveQuota(ctx, "acme", "snapshots", func() (int, error) { return 0, nil })
				mu.Lock()
				defer mu.Unlock()
				var te *errdefs.TypedError
				switch {
				case err == nil:
					releases = append(releases, release)
				case errors.As(err, &te) && te.Type == node.ProblemTenantQuota:
					refused++
				default:
					t.Errorf("reserve: %v", err)
				}
			}()
		}
	}
	wg.Wait()
	if len(releases) != 2 || refused != 4 {
		t.Fatalf("reserved %d, refused %d of 6: want 2 and 4", len(releases), refused)
	}
	releases[0]()
	waitFor(t, 10*time.Second, "the place given back in the fleet's count", func() bool {
		n, _, _ := qs[1].Counts(ctx, "snapshots", "acme")
		return n == 1
	})
	for _, c := range ctls {
		if release, err := c.ReserveQuota(ctx, "acme", "snapshots", func() (int, error) { return 0, nil }); err == nil {
			release()
			return
		}
	}
	t.Fatal("no host took the place given back")
}

// A CPU budget holds over the fleet: with 6 CPU-seconds used on a and 5
// on b today, of a budget of 10, a create is refused on both hosts with
// 429 cpu-budget-exhausted, although neither host alone used it up.
func TestFleetCPUBudget(t *testing.T) {
	hosts := startHosts(t)
	qs := openQuotas(t, hosts)
	ctx := context.Background()
	now := time.Now()
	ctls := make([]*admission.Controller, 2)
	for i, used := range []int64{6000, 5000} {
		st := hosts[i].st
		if err := st.CreateTenant(ctx, &store.Tenant{Name: "acme", Policy: `{"cpu_seconds_per_day":10}`, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("s%d", i)
		if err := st.CreateSession(ctx, &node.Session{ID: id, Template: "base", Driver: "runc", State: node.StateRunning,
			Tenant: "acme", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.AddSessionCPU(ctx, id, "acme", used, now); err != nil {
			t.Fatal(err)
		}
		ctls[i] = admission.New(admission.Options{Store: st, Fleet: qs[i]})
	}
	// Each host's part reaches the fleet's count (the monitor does this
	// every round; here each host's first call).
	if got := ctls[0].FleetCPU(ctx, "acme", 6000, now); got != 6000 {
		t.Fatalf("a's first count %d, want 6000", got)
	}
	if got := ctls[1].FleetCPU(ctx, "acme", 5000, now); got != 11000 {
		t.Fatalf("the fleet's count after b's %d, want 11000", got)
	}
	for i, c := range ctls {
		tn, p, err := c.Tenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = c.Admit(ctx, tn, p, 64)
		var te *errdefs.TypedError
		if !errors.As(err, &te) || te.Type != node.ProblemCPUBudgetExhausted {
			t.Fatalf("host %d: create with the fleet's budget used: %v, want cpu-budget-exhausted", i, err)
		}
	}
	// Reconcile rewrites a host's part from its store.
	if err := qs[0].Reconcile(ctx, ctls[0].FleetCount, nil); err != nil {
		t.Fatal(err)
	}
	if n, per, err := qs[2].Counts(ctx, "cpu-"+store.UsageDay(now), "acme"); err != nil || n != 11000 || per["a"] != 6000 {
		t.Fatalf("after reconcile: %d %v %v", n, per, err)
	}
}

// A snapshot one host took and another imported (a fork there pulled its
// replicated copy) is one of the tenant's snapshots over the fleet, not
// two: the importing host leaves its marked copies out of its count, so a
// tenant at one of max_snapshots 2 may still take another.
func TestFleetSnapshotImportCountedOnce(t *testing.T) {
	hosts := startHosts(t)
	qs := openQuotas(t, hosts)
	ctx := context.Background()
	imports := t.TempDir()
	ctls := make([]*admission.Controller, len(hosts))
	for i, h := range hosts {
		if err := h.st.CreateTenant(ctx, &store.Tenant{Name: "acme", Policy: `{"max_snapshots":2}`, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if i < 2 { // a took snap1, b holds a copy
			if err := h.st.CreateSnapshot(ctx, &node.Snapshot{ID: "snap1", Template: "base", Tenant: "acme", CreatedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		opts := admission.Options{Store: h.st, Fleet: qs[i]}
		if i == 1 { // b imported snap1 from a
			opts.ImportsDir = imports
		}
		ctls[i] = admission.New(opts)
	}
	if err := os.WriteFile(filepath.Join(imports, "snap1.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	// a's snapshot puts the tenant's entry in the fleet's counts (the
	// reconciliation rewrites entries that exist).
	release, err := ctls[0].ReserveQuota(ctx, "acme", "snapshots", func() (int, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	release()
	local := func(c *admission.Controller) func(what, tenant string) int { return c.FleetCount }
	for i, q := range qs[:2] {
		if err := q.Reconcile(ctx, local(ctls[i]), nil); err != nil {
			t.Fatal(err)
		}
	}
	if n, per, err := qs[2].Counts(ctx, "snapshots", "acme"); err != nil || n != 1 {
		t.Fatalf("fleet count of acme's snapshots %d (%v, %v): want 1, a's own", n, per, err)
	}
	release, err = ctls[2].ReserveQuota(ctx, "acme", "snapshots", func() (int, error) { return 0, nil })
	if err != nil {
		t.Fatalf("second snapshot of a limit of 2 refused: %v", err)
	}
	release()
}
