package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// TestAuditAppendOnly proves audit records come back in order with their
// fields, filters work, and the table refuses updates and deletes.
func TestAuditAppendOnly(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	recs := []*AuditRecord{
		{Tenant: "a", Session: "s1", Kind: "session.create", Outcome: "ok", KeyID: "k", RequestID: "r1", IdempotencyKey: "i1"},
		{Tenant: "a", Session: "s1", Kind: "exec", Outcome: "ok", Detail: map[string]any{"exit_code": 3}},
		{Tenant: "b", Session: "s2", Kind: "policy", Outcome: "denied"},
	}
	if err := s.AppendAudit(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	if recs[0].Seq == 0 || recs[1].Seq <= recs[0].Seq {
		t.Fatalf("seqs %d %d", recs[0].Seq, recs[1].Seq)
	}
	got, err := s.ListAudit(ctx, AuditFilter{Tenant: "a"})
	if err != nil || len(got) != 2 || got[0].RequestID != "r1" || got[0].IdempotencyKey != "i1" ||
		got[1].Detail["exit_code"] != float64(3) {
		t.Fatalf("tenant a: %+v %v", got, err)
	}
	for _, f := range []AuditFilter{{Kind: "session."}, {Outcome: "denied", Tenant: "b"}, {After: recs[1].Seq}, {Session: "s1", Limit: 1}} {
		if got, err := s.ListAudit(ctx, f); err != nil || len(got) != 1 {
			t.Errorf("filter %+v: %d records, %v", f, len(got), err)
		}
	}
	for _, q := range []string{`UPDATE audit SET outcome = 'ok'`, `DELETE FROM audit`} {
		if _, err := s.db.ExecContext(ctx, q); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: %v, want refused", q, err)
		}
	}
	if got, _ := s.ListAudit(ctx, AuditFilter{}); len(got) != 3 {
		t.Fatalf("%d records after the refused changes", len(got))
	}
}

// TestKeysOfTenants proves keys carry their tenant and admin flag, a
// revoked key stops authenticating at once (also when it was cached), and
// deleting a tenant deletes its keys.
func TestKeysOfTenants(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	if err := s.CreateTenant(ctx, &Tenant{Name: "acme", Policy: "{}", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	wantClass(t, s.CreateTenant(ctx, &Tenant{Name: "acme", Policy: "{}"}), errdefs.ErrConflict)
	if err := s.AddAPIKey(ctx, APIKey{ID: "k1", Tenant: "acme"}, "secret-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddAPIKey(ctx, APIKey{ID: "k2", Tenant: "acme", Admin: true}, "secret-2"); err != nil {
		t.Fatal(err)
	}
	k, err := s.AuthenticateKey(ctx, "secret-1")
	if err != nil || k.Tenant != "acme" || k.Admin {
		t.Fatalf("k1: %+v %v", k, err)
	}
	if k, err := s.AuthenticateKey(ctx, "secret-2"); err != nil || !k.Admin {
		t.Fatalf("k2: %+v %v", k, err)
	}
	if err := s.RevokeAPIKey(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthenticateKey(ctx, "secret-1"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("revoked key authenticated: %v", err)
	}
	wantClass(t, s.RevokeAPIKey(ctx, "nope"), errdefs.ErrNotFound)
	if err := s.RevokeAPIKey(ctx, "k1"); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	keys, err := s.ListAPIKeys(ctx, "acme")
	if err != nil || len(keys) != 2 || keys[0].RevokedAt.IsZero() {
		t.Fatalf("keys: %+v %v", keys, err)
	}
	if err := s.DeleteTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthenticateKey(ctx, "secret-2"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("key of a deleted tenant authenticated: %v", err)
	}
	// Its name is never reused: a new "acme" would inherit its records.
	wantClass(t, s.CreateTenant(ctx, &Tenant{Name: "acme", Policy: "{}"}), errdefs.ErrConflict)
	wantClass(t, s.DeleteTenant(ctx, "acme"), errdefs.ErrNotFound)
	if _, err := s.GetTenant(ctx, "acme"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted tenant still found: %v", err)
	}
}

// TestSessionCPUCountsOnce proves AddSessionCPU adds only what was not
// counted yet to the tenant's day, also when called again with the same
// or a smaller total (a restarted counter).
func TestSessionCPUCountsOnce(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	now := time.Now()
	if err := s.CreateSession(ctx, &node.Session{ID: "s1", Template: "base", Driver: "runc", State: node.StateRunning,
		Tenant: "acme", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ total, want int64 }{{1000, 1000}, {1000, 1000}, {2500, 2500}, {100, 2500}} {
		got, err := s.AddSessionCPU(ctx, "s1", "acme", c.total, now)
		if err != nil || got != c.want {
			t.Fatalf("AddSessionCPU(%d) = %d %v, want %d", c.total, got, err, c.want)
		}
	}
	if got, _ := s.TenantCPU(ctx, "acme", now); got != 2500 {
		t.Fatalf("TenantCPU = %d", got)
	}
	if got, _ := s.TenantCPU(ctx, "acme", now.Add(48*time.Hour)); got != 0 {
		t.Fatalf("TenantCPU another day = %d", got)
	}
}

// TestSessionsCPUInOneTransaction proves the monitor's batch: each
// session's new CPU goes to its own tenant once, an unknown session is
// skipped without failing the others, and every counted tenant's total
// comes back.
func TestSessionsCPUInOneTransaction(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	now := time.Now()
	for _, sess := range []struct{ id, tenant string }{{"a1", "acme"}, {"a2", "acme"}, {"b1", "beta"}} {
		if err := s.CreateSession(ctx, &node.Session{ID: sess.id, Template: "base", Driver: "runc", State: node.StateRunning,
			Tenant: sess.tenant, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	round := func(a1, a2, b1 int64) map[string]int64 {
		t.Helper()
		got, err := s.AddSessionsCPU(ctx, []CPUReading{
			{Session: "a1", Tenant: "acme", TotalMS: a1, At: now}, {Session: "gone", Tenant: "acme", TotalMS: 99, At: now},
			{Session: "a2", Tenant: "acme", TotalMS: a2, At: now}, {Session: "b1", Tenant: "beta", TotalMS: b1, At: now}})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := round(100, 200, 50); got["acme"] != 300 || got["beta"] != 50 || len(got) != 2 {
		t.Fatalf("first round: %v", got)
	}
	if got := round(100, 250, 40); got["acme"] != 350 || got["beta"] != 50 {
		t.Fatalf("second round (a restarted counter counts nothing): %v", got)
	}
	if got, _ := s.TenantCPU(ctx, "acme", now); got != 350 {
		t.Fatalf("TenantCPU(acme) = %d", got)
	}
	if _, err := s.AddSessionCPU(ctx, "gone", "acme", 5, now); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("AddSessionCPU of an unknown session: %v", err)
	}
}

// BenchmarkSessionsCPU is the store's part of one monitor round with 20
// running sessions: one transaction per session (before) against one for
// the round.
func BenchmarkSessionsCPU(b *testing.B) {
	s, _ := openTemp(b)
	ctx := context.Background()
	now := time.Now()
	var readings []CPUReading
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("s%d", i)
		if err := s.CreateSession(ctx, &node.Session{ID: id, Template: "base", Driver: "runc", State: node.StateRunning,
			Tenant: "acme", CreatedAt: now}); err != nil {
			b.Fatal(err)
		}
		readings = append(readings, CPUReading{Session: id, Tenant: "acme", At: now})
	}
	next := func() {
		for i := range readings {
			readings[i].TotalMS += 10
		}
	}
	b.Run("per-session", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			next()
			for _, r := range readings {
				if _, err := s.AddSessionCPU(ctx, r.Session, r.Tenant, r.TotalMS, r.At); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("one-transaction", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			next()
			if _, err := s.AddSessionsCPU(ctx, readings); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestMigrateToTenants proves an install from before tenants keeps working:
// its key becomes the default tenant's admin key, its sessions, snapshots
// and imported templates the default tenant's (the base template stays
// shared), and its idempotency keys are scoped to the default tenant.
func TestMigrateToTenants(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "forkbox.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 7; i++ {
		if _, err := db.Exec(migrations[i]); err != nil {
			t.Fatalf("migration %d: %v", i+1, err)
		}
	}
	for _, q := range []string{
		`PRAGMA user_version = 7`,
		`INSERT INTO api_keys (id, hash, name, created_at) VALUES ('old', '` + HashKey("old-secret") + `', 'default', 1)`,
		`INSERT INTO sessions (id, template, driver, state, cpu, memory_mb, pids, timeout_s, default_user, idempotency_key, created_at)
			VALUES ('s1', 'base', 'runc', 'running', 1, 512, 512, 300, 'user', 'step-1', 1)`,
		`INSERT INTO templates (name, source, created_at) VALUES ('base', 'builtin', 1), ('py', 'upload', 1)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k, err := s.AuthenticateKey(ctx, "old-secret")
	if err != nil || k.Tenant != DefaultTenant || !k.Admin {
		t.Fatalf("old key: %+v %v", k, err)
	}
	se, err := s.GetSession(ctx, "s1")
	if err != nil || se.Tenant != DefaultTenant || se.IdempotencyKey != "default/step-1" {
		t.Fatalf("old session: %+v %v", se, err)
	}
	if tpl, _ := s.GetTemplate(ctx, "base"); tpl.Tenant != "" {
		t.Fatalf("base template owned by %q", tpl.Tenant)
	}
	if tpl, _ := s.GetTemplate(ctx, "py"); tpl.Tenant != DefaultTenant {
		t.Fatalf("imported template owned by %q", tpl.Tenant)
	}
	tn, err := s.GetTenant(ctx, DefaultTenant)
	if err != nil || !strings.Contains(tn.Policy, `"*"`) {
		t.Fatalf("default tenant: %+v %v", tn, err)
	}
}

// TestAuditRecordsBounded proves what a request puts in a record is
// bounded and cleaned: a huge path is cut, control characters (terminal
// escapes) are replaced, and a "session" that is no id goes to detail.
func TestAuditRecordsBounded(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	rec := &AuditRecord{Tenant: "a", Session: "x\x1b[2K\rforged", Kind: "file.mkdir", Outcome: "error",
		Detail: map[string]any{"path": strings.Repeat("a", 900000), "error": "bad \x9b31m \x1b]0;t\x07", "list": make([]string, 500)}}
	if err := s.AppendAudit(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListAudit(ctx, AuditFilter{})
	if err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
	r := got[0]
	if r.Session != "" || strings.ContainsAny(r.Detail["session_ref"].(string), "\x1b\r") {
		t.Fatalf("session %q, session_ref %q", r.Session, r.Detail["session_ref"])
	}
	if len(r.Detail["path"].(string)) != maxAuditText || strings.ContainsAny(r.Detail["error"].(string), "\x1b\x07\u009b") {
		t.Fatalf("detail not bounded: %d bytes, %q", len(r.Detail["path"].(string)), r.Detail["error"])
	}
	if n := len(r.Detail["list"].([]any)); n != maxAuditList {
		t.Fatalf("list of %d", n)
	}
}

// BenchmarkAppendAudit measures one audit record's write (the cost every
// audited request pays before its answer).
func BenchmarkAppendAudit(b *testing.B) {
	s, err := Open(context.Background(), filepath.Join(b.TempDir(), "forkbox.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for b.Loop() {
		if err := s.AppendAudit(ctx, &AuditRecord{Tenant: "acme", Session: "s1", Kind: "exec", Outcome: "ok",
			RequestID: "r", Detail: map[string]any{"command_sha256": strings.Repeat("a", 64), "exit_code": 0}}); err != nil {
			b.Fatal(err)
		}
	}
}
