package inflight

import (
	"errors"
	"sync"
	"testing"

	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
)

// TestBoundsPerTenantAndTotal proves a tenant is refused past its own
// bound while another still gets through, everyone past the total, with
// the problem type and Retry-After, and that released bytes are
// available again.
func TestBoundsPerTenantAndTotal(t *testing.T) {
	b, err := New(Limits{Total: 100, PerTenant: 60}, 10)
	if err != nil {
		t.Fatal(err)
	}
	a1, err := b.Acquire("a", 50)
	if err != nil {
		t.Fatal(err)
	}
	wantRefused := func(tenant string, n int64) {
		t.Helper()
		_, err := b.Acquire(tenant, n)
		var te *errdefs.TypedError
		if !errors.As(err, &te) || te.Type != Problem || te.RetryAfter != RetryAfter || !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("%s +%d: %v, want a %s refusal", tenant, n, err, Problem)
		}
	}
	wantRefused("a", 11) // a: 50 + 11 > 60
	b1, err := b.Acquire("b", 40)
	if err != nil {
		t.Fatalf("another tenant within both bounds: %v", err)
	}
	wantRefused("c", 11) // total: 90 + 11 > 100
	if err := b1.Grow(10); err != nil {
		t.Fatal(err)
	}
	wantRefused("b", 1)
	a1.ShrinkTo(20)
	if ta, total := b.Used("a"); ta != 20 || total != 70 {
		t.Fatalf("after shrinking: a %d, total %d", ta, total)
	}
	a1.Release()
	a1.Release()
	b1.Release()
	if _, total := b.Used("a"); total != 0 || len(b.by) != 0 {
		t.Fatalf("after release: total %d, %v", total, b.by)
	}
}

// TestConcurrentHoldsNeverPassTheBound proves parallel acquires never
// hold more than the bound together.
func TestConcurrentHoldsNeverPassTheBound(t *testing.T) {
	b, _ := New(Limits{Total: 1000, PerTenant: 1000}, 10)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []*Hold
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if h, err := b.Acquire("t", 10); err == nil {
				mu.Lock()
				held = append(held, h)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if _, total := b.Used("t"); len(held) != 100 || total != 1000 {
		t.Fatalf("%d holds of 10 bytes, %d held, want 100 and 1000", len(held), total)
	}
}

// TestNewChecksBounds proves bounds that cannot hold one request, or a
// tenant bound over the total, are refused, and zero takes the defaults.
func TestNewChecksBounds(t *testing.T) {
	for _, l := range []Limits{{Total: 5}, {Total: 100, PerTenant: 5}, {Total: 100, PerTenant: 200}} {
		if _, err := New(l, 10); err == nil {
			t.Errorf("%+v accepted", l)
		}
	}
	b, err := New(Limits{}, 10)
	if err != nil || b.Limits() != (Limits{Total: defaults.ExecInflightTotal, PerTenant: defaults.ExecInflightPerTenant}) {
		t.Fatalf("defaults: %+v %v", b.Limits(), err)
	}
}
