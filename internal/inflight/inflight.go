// Package inflight bounds the bytes of exec requests in flight through the
// daemon, per tenant and over all tenants. An exec holds a fixed allowance
// (for the buffers it uses while it runs) and, while its body is read and
// passed on into the sandbox, the body's bytes; past a bound it is
// refused with a 429 problem of its own type and a Retry-After, before any
// of its body is read. One tenant's parallel execs therefore cannot take
// what the daemon can carry at once from every other tenant.
package inflight

import (
	"fmt"
	"sync"
	"time"

	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
)

// Problem is the problem type slug of a refusal.
const Problem = "exec-inflight-exceeded"

// RetryAfter is the Retry-After of a refusal: bodies in flight are passed
// on within about this long.
const RetryAfter = time.Second

// Limits are the bounds in bytes; zero fields take the defaults.
type Limits struct {
	// Total bounds the bytes held by every exec together.
	Total int64
	// PerTenant bounds the bytes held by one tenant's execs.
	PerTenant int64
}

// Budget counts the bytes held. It is safe for concurrent use.
type Budget struct {
	lim   Limits
	mu    sync.Mutex
	total int64
	by    map[string]int64
}

// New returns a budget with lim (defaults for zero fields). Each bound
// must hold at least one request's bytes (one), else New returns an error naming it.
func New(lim Limits, one int64) (*Budget, error) {
	if lim.Total == 0 {
		lim.Total = defaults.ExecInflightTotal
	}
	if lim.PerTenant == 0 {
		lim.PerTenant = min(defaults.ExecInflightPerTenant, lim.Total)
	}
	switch {
	case lim.Total < one:
		return nil, fmt.Errorf("the in-flight exec bound of %d MiB is below one exec's %d MiB", lim.Total>>20, one>>20)
	case lim.PerTenant < one:
		return nil, fmt.Errorf("the per-tenant in-flight exec bound of %d MiB is below one exec's %d MiB", lim.PerTenant>>20, one>>20)
	case lim.PerTenant > lim.Total:
		return nil, fmt.Errorf("the per-tenant in-flight exec bound (%d MiB) exceeds the total (%d MiB)", lim.PerTenant>>20, lim.Total>>20)
	}
	return &Budget{lim: lim, by: map[string]int64{}}, nil
}

// Limits returns the bounds in force.
func (b *Budget) Limits() Limits { return b.lim }

// Used returns the bytes held now by tenant and by everyone.
func (b *Budget) Used(tenant string) (tenantBytes, total int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.by[tenant], b.total
}

// Hold is bytes held for one exec; its methods are not safe for
// concurrent use with each other.
type Hold struct {
	b      *Budget
	tenant string
	n      int64
}

// Acquire holds n bytes for tenant, or returns a 429 *errdefs.TypedError
// (class ErrResourceExhausted, type Problem, RetryAfter) when that would
// put the tenant or everyone past its bound.
func (b *Budget) Acquire(tenant string, n int64) (*Hold, error) {
	h := &Hold{b: b, tenant: tenant}
	if err := h.Grow(n); err != nil {
		return nil, err
	}
	return h, nil
}

// Grow holds n more bytes, with Acquire's refusal past a bound (the bytes
// held so far stay held).
func (h *Hold) Grow(n int64) error {
	if n <= 0 {
		return nil
	}
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	var over string
	switch {
	case b.by[h.tenant]+n > b.lim.PerTenant:
		over = fmt.Sprintf("tenant %s has %d MiB of exec requests in flight; %d MiB more would pass its bound of %d MiB",
			h.tenant, b.by[h.tenant]>>20, mib(n), b.lim.PerTenant>>20)
	case b.total+n > b.lim.Total:
		over = fmt.Sprintf("this host has %d MiB of exec requests in flight; %d MiB more would pass its bound of %d MiB",
			b.total>>20, mib(n), b.lim.Total>>20)
	}
	if over != "" {
		te := errdefs.Typed(errdefs.ErrResourceExhausted, Problem, "%s; retry shortly", over)
		te.RetryAfter = RetryAfter
		return te
	}
	b.by[h.tenant] += n
	b.total += n
	h.n += n
	return nil
}

// mib rounds n up to MiB.
func mib(n int64) int64 { return (n + 1<<20 - 1) >> 20 }

// ShrinkTo gives back what is held beyond n bytes.
func (h *Hold) ShrinkTo(n int64) {
	if n < 0 {
		n = 0
	}
	if h.n <= n {
		return
	}
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	d := h.n - n
	h.n = n
	b.total -= d
	if b.by[h.tenant] -= d; b.by[h.tenant] == 0 {
		delete(b.by, h.tenant)
	}
}

// Release gives back everything; releasing twice is fine.
func (h *Hold) Release() { h.ShrinkTo(0) }
