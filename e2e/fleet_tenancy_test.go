package e2e

import (
	"errors"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestFleetTenancy runs three `forkbox serve` as one cluster: a tenant
// (max_sessions 2) and its key made through host a's API create a
// session through b's and c's; a third, through a, is refused with 429
// as on one host (the limit holds over the fleet); c's GET /v1/audit
// reads the tenant's records of every host (a's refusal, b's and c's
// creates), each naming its host; the key revoked
// on a is refused on b.
func TestFleetTenancy(t *testing.T) {
	need(t)
	procs := startFleet(t, []string{"a", "b", "c"})
	a, b, c := procs[0], procs[1], procs[2]
	ctx := ctxFor(t, 5*time.Minute)
	if _, err := a.c.CreateTenant(ctx, "fleetco", client.TenantPolicy{MaxSessions: 2}); err != nil {
		t.Fatal(err)
	}
	key, err := a.c.CreateKey(ctx, "fleetco", "e2e", false)
	if err != nil {
		t.Fatal(err)
	}
	as := func(p *serveProc) *client.Client { return client.New(p.c.BaseURL(), key.Secret, nil) }
	waitUntil(t, 30*time.Second, "a's key authenticates on b and c", func() bool {
		for _, p := range []*serveProc{b, c} {
			if _, err := as(p).ListSessions(ctxFor(t, 5*time.Second), client.ListOptions{}); err != nil {
				return false
			}
		}
		return true
	})
	var made []struct {
		c  *client.Client
		id string
	}
	defer func() {
		for _, m := range made {
			if err := m.c.DeleteSession(ctxFor(t, time.Minute), m.id); err != nil {
				t.Errorf("destroy %s: %v", m.id, err)
			}
		}
	}()
	for _, p := range []*serveProc{b, c} {
		s, _, err := as(p).CreateSession(ctx, client.CreateRequest{}, "")
		if err != nil {
			t.Fatalf("create through the tenant's key on another host: %v", err)
		}
		made = append(made, struct {
			c  *client.Client
			id string
		}{as(p), s.ID})
	}
	_, _, err = as(a).CreateSession(ctx, client.CreateRequest{}, "")
	var pe *client.Error
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !errors.As(err, &pe) || pe.Status != 429 {
		t.Fatalf("a third session of a tenant with max_sessions 2 (two on other hosts): %v, want 429", err)
	}

	waitUntil(t, 30*time.Second, "c reads a's and b's audit records of the tenant", func() bool {
		l, err := c.c.Audit(ctxFor(t, 10*time.Second), client.AuditFilter{Tenant: "fleetco"})
		if err != nil {
			return false
		}
		by := map[string]map[string]bool{}
		for _, r := range l.Records {
			if by[r.Host] == nil {
				by[r.Host] = map[string]bool{}
			}
			by[r.Host][r.Kind] = true
		}
		ok := by["b"]["session.create"] && by["c"]["session.create"] && by["a"]["policy"]
		return ok
	})

	for _, m := range made {
		if err := m.c.DeleteSession(ctx, m.id); err != nil {
			t.Fatal(err)
		}
	}
	made = nil
	if err := a.c.RevokeKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the key revoked on a refused on b", func() bool {
		_, err := as(b).ListSessions(ctxFor(t, 5*time.Second), client.ListOptions{})
		return errors.Is(err, errdefs.ErrUnauthenticated)
	})
}
