package admission

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// harness is a controller over a real store in a temporary directory.
type harness struct {
	c  *Controller
	st *store.Store
}

func newHarness(t *testing.T, capacity Capacity) *harness {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rec := audit.New(st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return &harness{c: New(Options{Store: st, Capacity: capacity, Audit: rec}), st: st}
}

// tenant stores tenant name with policy p and returns its record.
func (h *harness) tenant(t *testing.T, name string, p tenancy.Policy) *store.Tenant {
	t.Helper()
	if err := ValidatePolicy(&p); err != nil {
		t.Fatalf("policy of %s: %v", name, err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := h.st.CreateTenant(ctx, &store.Tenant{Name: name, Policy: string(b), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	tr, got, err := h.c.Tenant(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got.MaxSessions != p.MaxSessions || len(got.EgressAllow) != len(p.EgressAllow) {
		t.Fatalf("policy read back %+v, want %+v", got, p)
	}
	return tr
}

// admit admits one session of tr with memoryMB.
func (h *harness) admit(t *testing.T, tr *store.Tenant, memoryMB int64) (*Reservation, error) {
	t.Helper()
	p, err := PolicyOf(tr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, r, err := h.c.Admit(context.Background(), tr, p, memoryMB)
	if err == nil && ReservationOf(ctx) != r {
		t.Fatal("the admitted context does not carry the reservation")
	}
	return r, err
}

// denials returns the "policy" audit records of tenant, oldest first.
func (h *harness) denials(t *testing.T, tenant string) []*store.AuditRecord {
	t.Helper()
	recs, err := h.st.ListAudit(context.Background(), store.AuditFilter{Tenant: tenant, Kind: "policy", Outcome: audit.Denied})
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// wantTyped fails unless err is a *TypedError of class and type typ.
func wantTyped(t *testing.T, err error, class error, typ string) *errdefs.TypedError {
	t.Helper()
	var te *errdefs.TypedError
	if !errors.As(err, &te) || te.Type != typ || !errors.Is(err, class) {
		t.Fatalf("error %v (%T), want %v of type %s", err, err, class, typ)
	}
	return te
}

// TestTemplateApproval: a template off the tenant's list is 400
// image-not-approved naming the field, and recorded; one on it passes.
func TestTemplateApproval(t *testing.T) {
	h := newHarness(t, Capacity{})
	p := tenancy.Policy{Templates: []string{"python"}}
	h.tenant(t, "acme", p)
	ctx := context.Background()
	err := h.c.Check(ctx, "acme", p, &node.CreateSpec{Template: "base"})
	te := wantTyped(t, err, errdefs.ErrInvalidArgument, node.ProblemImageNotApproved)
	if te.Field != "template" {
		t.Errorf("field %q, want template", te.Field)
	}
	if err := h.c.Check(ctx, "acme", p, &node.CreateSpec{Template: "python"}); err != nil {
		t.Fatalf("approved template refused: %v", err)
	}
	recs := h.denials(t, "acme")
	if len(recs) != 1 || recs[0].Detail["rule"] != node.ProblemImageNotApproved {
		t.Fatalf("denials %+v, want one image-not-approved", recs)
	}
}

// TestSizeBounds: each size over the tenant's bound is a 400 naming its
// field (recorded as max-size:FIELD); a size at the bound passes, and
// Defaults fills left-out sizes capped at the bounds.
func TestSizeBounds(t *testing.T) {
	h := newHarness(t, Capacity{})
	p := tenancy.Policy{MaxCPU: 1, MaxMemoryMB: 256, MaxDiskMB: 1024, MaxPids: 64, MaxTimeoutS: 60}
	h.tenant(t, "small", p)
	atBound := node.CreateSpec{Template: "base", CPU: 1, MemoryMB: 256, DiskMB: 1024, Pids: 64, TimeoutS: 60}
	ctx := context.Background()
	if err := h.c.Check(ctx, "small", p, &atBound); err != nil {
		t.Fatalf("a spec at the bounds: %v", err)
	}
	for field, change := range map[string]func(*node.CreateSpec){
		"cpu":       func(s *node.CreateSpec) { s.CPU = 1.5 },
		"memory_mb": func(s *node.CreateSpec) { s.MemoryMB = 257 },
		"disk_mb":   func(s *node.CreateSpec) { s.DiskMB = 2048 },
		"pids":      func(s *node.CreateSpec) { s.Pids = 65 },
		"timeout_s": func(s *node.CreateSpec) { s.TimeoutS = 61 },
	} {
		spec := atBound
		change(&spec)
		err := h.c.Check(ctx, "small", p, &spec)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != field {
			t.Errorf("%s over its bound: %v, want invalid argument naming %s", field, err, field)
		}
	}
	if n := len(h.denials(t, "small")); n != 5 {
		t.Errorf("%d denials recorded, want 5", n)
	}
	limits := node.Limits{DefaultCPU: 2, DefaultMemoryMB: 512, DefaultDiskMB: 4096, DefaultPids: 512, DefaultTimeoutS: 300}
	spec := node.CreateSpec{Template: "base", DiskMB: 100}
	Defaults(&spec, p, limits)
	want := node.CreateSpec{Template: "base", CPU: 1, MemoryMB: 256, DiskMB: 100, Pids: 64, TimeoutS: 60}
	if spec.CPU != want.CPU || spec.MemoryMB != want.MemoryMB || spec.DiskMB != want.DiskMB || spec.Pids != want.Pids || spec.TimeoutS != want.TimeoutS {
		t.Errorf("defaults %+v, want %+v", spec, want)
	}
	open := node.CreateSpec{}
	Defaults(&open, tenancy.Policy{}, limits)
	if open.CPU != 0 || open.MemoryMB != 0 {
		t.Errorf("defaults without bounds %+v, want left to the core", open)
	}
	if err := h.c.CheckTimeout(ctx, "small", 61); errdefs.Field(err) != "timeout_s" {
		t.Errorf("CheckTimeout over the bound: %v", err)
	}
	if err := h.c.CheckTimeout(ctx, "small", 60); err != nil {
		t.Errorf("CheckTimeout at the bound: %v", err)
	}
}

// TestEgressCeiling: an allow-list entry outside the tenant's ceiling is
// 403 egress-not-allowed naming the entry; inside passes; an empty ceiling
// allows no network at all, "*" any.
func TestEgressCeiling(t *testing.T) {
	h := newHarness(t, Capacity{})
	ctx := context.Background()
	p := tenancy.Policy{EgressAllow: []string{"*.example.com:443", "198.51.100.0/24"}}
	h.tenant(t, "net", p)
	spec := func(allow ...string) *node.CreateSpec {
		return &node.CreateSpec{Template: "base", Network: &node.Network{Allow: allow}}
	}
	if err := h.c.Check(ctx, "net", p, spec("api.example.com:443", "198.51.100.7:8080")); err != nil {
		t.Fatalf("entries inside the ceiling: %v", err)
	}
	err := h.c.Check(ctx, "net", p, spec("api.example.com:443", "api.example.com:80"))
	if te := wantTyped(t, err, errdefs.ErrPermissionDenied, node.ProblemEgressNotAllowed); te.Field != "network.allow[1]" {
		t.Errorf("field %q, want network.allow[1]", te.Field)
	}
	if err := h.c.Check(ctx, "net", p, spec("no port")); errdefs.Field(err) != "network.allow[0]" {
		t.Errorf("a malformed entry: %v, want invalid network.allow[0]", err)
	}
	closed := tenancy.Policy{}
	h.tenant(t, "closed", closed)
	wantTyped(t, h.c.Check(ctx, "closed", closed, spec("api.example.com:443")), errdefs.ErrPermissionDenied, node.ProblemEgressNotAllowed)
	if err := h.c.Check(ctx, "closed", closed, &node.CreateSpec{Template: "base"}); err != nil {
		t.Errorf("no network under an empty ceiling: %v", err)
	}
	anyNet := tenancy.Policy{EgressAllow: []string{"*"}}
	h.tenant(t, "open", anyNet)
	if err := h.c.Check(ctx, "open", anyNet, spec("anything.test:1", "0.0.0.0/0")); err != nil {
		t.Errorf("an open ceiling: %v", err)
	}
}

// TestMaxSessions: a tenant at its concurrent-session limit gets 429
// tenant-concurrency-exceeded with a Retry-After, whoever else runs;
// parallel admits never get past the limit; a release (once, however
// often it is called) makes room.
func TestMaxSessions(t *testing.T) {
	h := newHarness(t, Capacity{})
	tr := h.tenant(t, "conc", tenancy.Policy{MaxSessions: 3})
	other := h.tenant(t, "other", tenancy.Policy{})
	var mu sync.Mutex
	var got []*Reservation
	var wg sync.WaitGroup
	refused := 0
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := h.admit(t, tr, 64)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				te := wantTyped(t, err, errdefs.ErrResourceExhausted, node.ProblemTenantConcurrency)
				if te.RetryAfter != capacityRetry {
					t.Errorf("Retry-After %v, want %v", te.RetryAfter, capacityRetry)
				}
				refused++
				return
			}
			got = append(got, r)
		}()
	}
	wg.Wait()
	if len(got) != 3 || refused != 9 || h.c.TenantSessions("conc") != 3 {
		t.Fatalf("%d admitted, %d refused, count %d; want 3, 9, 3", len(got), refused, h.c.TenantSessions("conc"))
	}
	if _, err := h.admit(t, other, 64); err != nil {
		t.Fatalf("another tenant refused: %v", err)
	}
	got[0].Release()
	got[0].Release()
	if n := h.c.TenantSessions("conc"); n != 2 {
		t.Fatalf("count %d after one release (twice), want 2", n)
	}
	if _, err := h.admit(t, tr, 64); err != nil {
		t.Fatalf("admit after a release: %v", err)
	}
	if _, err := h.admit(t, tr, 64); err == nil {
		t.Fatal("admitted past the limit after a double release")
	}
	if n := len(h.denials(t, "conc")); n != 10 {
		t.Errorf("%d denials recorded, want 10", n)
	}
}

// TestCapacity: the host's session and memory caps hold over all
// tenants (503 capacity-unavailable), adopted sessions count, and after
// Stop nothing is admitted.
func TestCapacity(t *testing.T) {
	h := newHarness(t, Capacity{MaxSessions: 3, MaxMemoryMB: 1024})
	a := h.tenant(t, "a", tenancy.Policy{})
	b := h.tenant(t, "b", tenancy.Policy{})
	ra, err := h.admit(t, a, 512)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.admit(t, b, 600)
	wantTyped(t, err, errdefs.ErrUnavailable, node.ProblemCapacity)
	if _, err := h.admit(t, b, 512); err != nil {
		t.Fatalf("a fit at the memory cap: %v", err)
	}
	ra.Release()
	adopted := h.c.Adopt("a", 0) // a session a restarted daemon found running
	if _, err := h.admit(t, a, 0); err != nil {
		t.Fatal(err)
	}
	if n := h.c.Admitted(); n != 3 {
		t.Fatalf("admitted %d, want 3", n)
	}
	_, err = h.admit(t, b, 0)
	if te := wantTyped(t, err, errdefs.ErrUnavailable, node.ProblemCapacity); te.RetryAfter != capacityRetry {
		t.Errorf("Retry-After %v", te.RetryAfter)
	}
	adopted.Release()
	h.c.Stop()
	_, err = h.admit(t, b, 0)
	wantTyped(t, err, errdefs.ErrUnavailable, node.ProblemCapacity)
	if n := h.c.Admitted(); n != 2 {
		t.Fatalf("admitted %d after a release and Stop, want 2", n)
	}
}

// TestSuspendedTenant: a flagged tenant whose policy suspends it then is
// 403 tenant-suspended with the flag's reason; without that policy, or
// once the flag is cleared, it is admitted.
func TestSuspendedTenant(t *testing.T) {
	h := newHarness(t, Capacity{})
	ctx := context.Background()
	h.tenant(t, "strict", tenancy.Policy{SuspendWhenFlagged: true})
	h.tenant(t, "lenient", tenancy.Policy{})
	for _, name := range []string{"strict", "lenient"} {
		if err := h.st.FlagTenant(ctx, name, "mining: test", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	tr, _, err := h.c.Tenant(ctx, "strict")
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.admit(t, tr, 0)
	wantTyped(t, err, errdefs.ErrPermissionDenied, node.ProblemTenantSuspended)
	lenient, _, _ := h.c.Tenant(ctx, "lenient")
	if _, err := h.admit(t, lenient, 0); err != nil {
		t.Fatalf("flagged tenant without suspension: %v", err)
	}
	if err := h.st.FlagTenant(ctx, "strict", "", time.Time{}); err != nil {
		t.Fatal(err)
	}
	tr, _, _ = h.c.Tenant(ctx, "strict")
	if _, err := h.admit(t, tr, 0); err != nil {
		t.Fatalf("after the flag was cleared: %v", err)
	}
	if _, _, err := h.c.Tenant(ctx, "nobody"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown tenant: %v, want not found", err)
	}
}

// TestCPUBudget: a tenant that used its CPU-seconds for today is 429
// cpu-budget-exhausted until the next UTC midnight; under it, admitted.
func TestCPUBudget(t *testing.T) {
	h := newHarness(t, Capacity{})
	ctx := context.Background()
	tr := h.tenant(t, "budget", tenancy.Policy{CPUSecondsPerDay: 3})
	if err := h.st.CreateSession(ctx, &node.Session{ID: "s1", Template: "base", Driver: "runc", State: node.StateRunning,
		CPU: 1, MemoryMB: 64, Pids: 64, TimeoutS: 60, Tenant: "budget", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.st.AddSessionCPU(ctx, "s1", "budget", 2999, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.admit(t, tr, 0); err != nil {
		t.Fatalf("under the budget: %v", err)
	}
	if _, err := h.st.AddSessionCPU(ctx, "s1", "budget", 3000, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, err := h.admit(t, tr, 0)
	te := wantTyped(t, err, errdefs.ErrResourceExhausted, node.ProblemCPUBudgetExhausted)
	if te.RetryAfter <= 0 || te.RetryAfter > 24*time.Hour {
		t.Errorf("Retry-After %v, want until the next UTC midnight", te.RetryAfter)
	}
	if !BudgetUsed(tenancy.Policy{CPUSecondsPerDay: 3}, 3000) || BudgetUsed(tenancy.Policy{}, 1<<40) {
		t.Error("BudgetUsed disagrees with the budget")
	}
}
