package admission

import (
	"context"
	"errors"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// TestQuotas: a tenant at its snapshot quota (those it keeps plus those
// being made) gets 429 tenant-quota-exceeded; a release, once, frees the
// place; no tenant, no limit or another kind reserve nothing.
func TestQuotas(t *testing.T) {
	h := newHarness(t, Capacity{})
	ctx := context.Background()
	h.tenant(t, "quota", tenancy.Policy{MaxSnapshots: 2, MaxTemplates: 1})
	kept := 1
	count := func() (int, error) { return kept, nil }
	release, err := h.c.ReserveQuota(ctx, "quota", "snapshots", count)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.c.ReserveQuota(ctx, "quota", "snapshots", count)
	wantTyped(t, err, errdefs.ErrResourceExhausted, node.ProblemTenantQuota)
	release()
	release()
	r2, err := h.c.ReserveQuota(ctx, "quota", "snapshots", count)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := h.c.ReserveQuota(ctx, "quota", "snapshots", count); err == nil {
		t.Fatal("reserved past the quota after a double release")
	}
	r2()
	kept = 2
	if _, err := h.c.ReserveQuota(ctx, "quota", "snapshots", count); err == nil {
		t.Fatal("reserved with the quota kept")
	}
	if _, err := h.c.ReserveQuota(ctx, "quota", "templates", func() (int, error) { return 0, nil }); err != nil {
		t.Fatalf("a template under its own quota: %v", err)
	}
	boom := errors.New("count failed")
	if _, err := h.c.ReserveQuota(ctx, "quota", "templates", func() (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Errorf("a failed count: %v", err)
	}
	if _, err := h.c.ReserveQuota(ctx, "", "snapshots", count); err != nil {
		t.Errorf("forkbox's own snapshot: %v", err)
	}
	if _, err := h.c.ReserveQuota(ctx, "nobody", "snapshots", count); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown tenant: %v", err)
	}
	if n := len(h.denials(t, "quota")); n != 3 {
		t.Errorf("%d denials recorded, want 3", n)
	}
}

// TestValidatePolicy: a bad policy is refused naming its field.
func TestValidatePolicy(t *testing.T) {
	for field, p := range map[string]tenancy.Policy{
		"policy.templates[1]":        {Templates: []string{"ok", ""}},
		"policy.max_memory_mb":       {MaxMemoryMB: -1},
		"policy.max_sessions":        {MaxSessions: -1},
		"policy.cpu_seconds_per_day": {CPUSecondsPerDay: -1},
		"policy.egress_allow[1]":     {EgressAllow: []string{"*", "no-port"}},
	} {
		if err := ValidatePolicy(&p); errdefs.Field(err) != field {
			t.Errorf("%+v: %v, want invalid %s", p, err, field)
		}
	}
	if err := ValidatePolicy(&tenancy.Policy{MaxSessions: 1, EgressAllow: []string{"a.example.com:443"}}); err != nil {
		t.Errorf("a valid policy: %v", err)
	}
}
