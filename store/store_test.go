package store

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// openTemp opens a fresh database in t's temporary directory; it closes with t.
func openTemp(t testing.TB) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "forkbox.db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// session returns a valid session record with id, created at created.
func session(id string, created time.Time) *node.Session {
	return &node.Session{
		ID: id, Template: "base", Driver: "runc", State: node.StateRunning,
		CPU: 1.5, MemoryMB: 512, Pids: 256, TimeoutS: 300,
		DefaultUser: "user", Workdir: "/home/user",
		Env:       map[string]string{"A": "1"},
		Metadata:  map[string]string{"team": "x"},
		CreatedAt: created,
	}
}

// wantClass fails t unless err wraps class.
func wantClass(t *testing.T, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("err = %v, want %v", err, class)
	}
}

// TestMigrateFromEmptyAndReopen proves a new database is migrated to the
// latest schema version, and reopening it keeps the version and the data.
func TestMigrateFromEmptyAndReopen(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t)
	v, err := s.SchemaVersion(ctx)
	if err != nil || v != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", v, err, len(migrations))
	}
	created := time.UnixMilli(1_700_000_000_123).UTC()
	if err := s.CreateSession(ctx, session("s1", created)); err != nil {
		t.Fatal(err)
	}
	if err := s.AddAPIKey(ctx, APIKey{ID: "k1", Name: "ci", Tenant: DefaultTenant}, "secret"); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, &TemplateRecord{Name: "base", Source: "docker.io/library/alpine", CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if v, err := s2.SchemaVersion(ctx); err != nil || v != len(migrations) {
		t.Fatalf("after reopen: schema version = %d, %v", v, err)
	}
	got, err := s2.GetSession(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, session("s1", created)) {
		t.Fatalf("after reopen: %+v", got)
	}
	if n, err := s2.CountAPIKeys(ctx); err != nil || n != 1 {
		t.Fatalf("after reopen: %d keys, %v", n, err)
	}
	if _, err := s2.GetTemplate(ctx, "base"); err != nil {
		t.Fatal(err)
	}
}

// TestNewerSchemaRefused proves a database from a newer forkbox is not
// opened (and not modified).
func TestNewerSchemaRefused(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t)
	if _, err := s.db.ExecContext(ctx, "PRAGMA user_version = 999"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(ctx, path); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("opening a newer schema: %v, want unavailable", err)
	}
}

// TestSessionRoundTripAndUpdate proves every field survives create and
// get (UTC times at millisecond precision, zero times stay zero), and that
// update writes state, reason, detail and times.
func TestSessionRoundTripAndUpdate(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	created := time.Date(2026, 1, 2, 3, 4, 5, 678_900_000, time.FixedZone("X", 3600))
	in := session("s1", created)
	in.State = node.StateCreating
	in.IdempotencyKey = "key-1"
	in.RequestHash = "h"
	in.Env = map[string]string{"QUOTE": `a"b`, "NL": "x\ny"}
	if err := s.CreateSession(ctx, in); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSession(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	want := *in
	want.CreatedAt = created.Truncate(time.Millisecond).UTC()
	if !reflect.DeepEqual(got, &want) {
		t.Fatalf("got  %+v\nwant %+v", got, &want)
	}
	if !got.StartedAt.IsZero() || !got.EndedAt.IsZero() {
		t.Fatal("unset times are not zero")
	}
	byKey, err := s.GetSessionByIdempotencyKey(ctx, "key-1")
	if err != nil || byKey.ID != "s1" {
		t.Fatalf("by idempotency key: %v, %v", byKey, err)
	}

	started := time.UnixMilli(1_800_000_000_000).UTC()
	got.State, got.Reason, got.Detail = node.StateTerminated, node.ReasonTimeout, "ran out of time"
	got.StartedAt, got.ExpiresAt, got.EndedAt = started, started.Add(time.Minute), started.Add(2*time.Minute)
	got.Template = "ignored" // immutable: update must not write it
	if err := s.UpdateSession(ctx, got); err != nil {
		t.Fatal(err)
	}
	after, err := s.GetSession(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if after.State != node.StateTerminated || after.Reason != node.ReasonTimeout || after.Detail != "ran out of time" ||
		!after.StartedAt.Equal(started) || !after.ExpiresAt.Equal(started.Add(time.Minute)) ||
		!after.EndedAt.Equal(started.Add(2*time.Minute)) || after.Template != "base" {
		t.Fatalf("after update: %+v", after)
	}

	// The pause state survives a restart: when, the time left, and whether
	// the session paused itself (then its next call resumes it).
	after.State, after.PausedAt, after.Remaining, after.AutoPaused = node.StatePaused, started, 90*time.Second, true
	if err := s.UpdateSession(ctx, after); err != nil {
		t.Fatal(err)
	}
	paused, err := s.GetSession(ctx, "s1")
	if err != nil || paused.State != node.StatePaused || !paused.PausedAt.Equal(started) ||
		paused.Remaining != 90*time.Second || !paused.AutoPaused {
		t.Fatalf("paused: %+v %v", paused, err)
	}
	wantClass(t, s.UpdateSession(ctx, &node.Session{ID: "nope"}), errdefs.ErrNotFound)
}

// TestSessionConflictsAndNotFound proves a duplicate id and a duplicate
// idempotency key are conflicts, sessions without a key never conflict on
// it, and unknown ids or keys are not found.
func TestSessionConflictsAndNotFound(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	now := time.Now()
	a := session("a", now)
	a.IdempotencyKey = "k"
	if err := s.CreateSession(ctx, a); err != nil {
		t.Fatal(err)
	}
	wantClass(t, s.CreateSession(ctx, session("a", now)), errdefs.ErrConflict)
	b := session("b", now)
	b.IdempotencyKey = "k"
	wantClass(t, s.CreateSession(ctx, b), errdefs.ErrConflict)
	for _, id := range []string{"c", "d"} { // no key: NULL, not a duplicate ""
		if err := s.CreateSession(ctx, session(id, now)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.GetSession(ctx, "missing")
	wantClass(t, err, errdefs.ErrNotFound)
	_, err = s.GetSessionByIdempotencyKey(ctx, "missing")
	wantClass(t, err, errdefs.ErrNotFound)
}

// TestReleaseIdempotencyKey proves a released key finds no session and can
// be used by a new one, while the old session stays.
func TestReleaseIdempotencyKey(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	a := session("a", time.Now())
	a.IdempotencyKey = "k"
	if err := s.CreateSession(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseIdempotencyKey(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	_, err := s.GetSessionByIdempotencyKey(ctx, "k")
	wantClass(t, err, errdefs.ErrNotFound)
	b := session("b", time.Now())
	b.IdempotencyKey = "k"
	if err := s.CreateSession(ctx, b); err != nil {
		t.Fatalf("reuse a released key: %v", err)
	}
	if got, err := s.GetSession(ctx, "a"); err != nil || got.IdempotencyKey != "" {
		t.Fatalf("session a after release: %+v %v", got, err)
	}
}

// ids returns the ids of sessions, in order.
func ids(list []*node.Session) []string {
	out := []string{}
	for _, se := range list {
		out = append(out, se.ID)
	}
	return out
}

// TestListSessions proves newest-first order, state filters, metadata
// filters (also with quotes, dots, backslashes and brackets in the key),
// their combination and the limit.
func TestListSessions(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	base := time.UnixMilli(1_700_000_000_000)
	odd := `we"ird.key\[0]`
	specs := []struct {
		id    string
		state node.State
		meta  map[string]string
	}{
		{"s1", node.StateRunning, map[string]string{"team": "a", odd: "v"}},
		{"s2", node.StateTerminated, map[string]string{"team": "a"}},
		{"s3", node.StateRunning, map[string]string{"team": "b", "weird": "v"}},
		{"s4", node.StateCreating, nil},
		{"s5", node.StateRunning, map[string]string{"team": "a", "env": "prod"}},
	}
	for i, sp := range specs {
		se := session(sp.id, base.Add(time.Duration(i)*time.Second))
		se.State, se.Metadata = sp.state, sp.meta
		if err := s.CreateSession(ctx, se); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		f    node.SessionFilter
		want []string
	}{
		{"all", node.SessionFilter{}, []string{"s5", "s4", "s3", "s2", "s1"}},
		{"running", node.SessionFilter{States: []node.State{node.StateRunning}}, []string{"s5", "s3", "s1"}},
		{"two states", node.SessionFilter{States: []node.State{node.StateCreating, node.StateTerminated}}, []string{"s4", "s2"}},
		{"metadata", node.SessionFilter{Metadata: map[string]string{"team": "a"}}, []string{"s5", "s2", "s1"}},
		{"metadata and state", node.SessionFilter{States: []node.State{node.StateRunning}, Metadata: map[string]string{"team": "a"}}, []string{"s5", "s1"}},
		{"two metadata keys", node.SessionFilter{Metadata: map[string]string{"team": "a", "env": "prod"}}, []string{"s5"}},
		{"odd key", node.SessionFilter{Metadata: map[string]string{odd: "v"}}, []string{"s1"}},
		{"key with a dot is not a path", node.SessionFilter{Metadata: map[string]string{"weird.key": "v"}}, []string{}},
		{"no match", node.SessionFilter{Metadata: map[string]string{"team": "z"}}, []string{}},
		{"limit", node.SessionFilter{Limit: 2}, []string{"s5", "s4"}},
		{"limit with filter", node.SessionFilter{States: []node.State{node.StateRunning}, Limit: 1}, []string{"s5"}},
	} {
		got, err := s.ListSessions(ctx, tc.f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(ids(got), tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, ids(got), tc.want)
		}
	}
}

// TestAPIKeys proves a key authenticates with its secret only (a wrong
// secret is unauthenticated), records its last use, and duplicate ids or
// secrets conflict.
func TestAPIKeys(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	before := time.Now().Add(-time.Second)
	if err := s.AddAPIKey(ctx, APIKey{ID: "k1", Name: "laptop", Tenant: DefaultTenant}, "s3cret"); err != nil {
		t.Fatal(err)
	}
	wantClass(t, s.AddAPIKey(ctx, APIKey{ID: "k1", Name: "other", Tenant: DefaultTenant}, "different"), errdefs.ErrConflict)
	wantClass(t, s.AddAPIKey(ctx, APIKey{ID: "k2", Name: "copy", Tenant: DefaultTenant}, "s3cret"), errdefs.ErrConflict)
	if n, err := s.CountAPIKeys(ctx); err != nil || n != 1 {
		t.Fatalf("%d keys, %v", n, err)
	}

	_, err := s.AuthenticateKey(ctx, "wrong")
	wantClass(t, err, errdefs.ErrUnauthenticated)
	_, err = s.AuthenticateKey(ctx, "")
	wantClass(t, err, errdefs.ErrUnauthenticated)

	k, err := s.AuthenticateKey(ctx, "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	if k.ID != "k1" || k.Name != "laptop" || k.CreatedAt.Before(before) || k.LastUsedAt.Before(before) {
		t.Fatalf("key = %+v", k)
	}
	var stored int64
	if err := s.db.QueryRowContext(ctx, `SELECT last_used_at FROM api_keys WHERE id = 'k1'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored == 0 || !fromMS(stored).Equal(k.LastUsedAt) {
		t.Fatalf("stored last_used_at %d, returned %v", stored, k.LastUsedAt)
	}
	again, err := s.AuthenticateKey(ctx, "s3cret")
	if err != nil || !again.LastUsedAt.Equal(k.LastUsedAt) {
		t.Fatalf("second use within a minute: %+v, %v; want last_used_at kept", again, err)
	}
	if HashKey("s3cret") == "s3cret" || len(HashKey("s3cret")) != 64 {
		t.Fatal("HashKey is not a hex SHA-256")
	}
}

// TestAuthenticateKeyDatabaseError proves a database failure is reported
// as such, not disguised as a bad key.
func TestAuthenticateKeyDatabaseError(t *testing.T) {
	s, _ := openTemp(t)
	s.Close()
	_, err := s.AuthenticateKey(context.Background(), "anything")
	if err == nil || errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("err = %v, want a database error", err)
	}
}

// TestTemplates proves put (insert and replace), get, list by name and
// delete, with not found for unknown names.
func TestTemplates(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	at := time.UnixMilli(1_700_000_000_000).UTC()
	for _, r := range []*TemplateRecord{
		{Name: "zeta", Source: "img:z", Digest: "sha256:1", SizeBytes: 10, CreatedAt: at},
		{Name: "alpha", Source: "img:a", SizeBytes: 5, CreatedAt: at},
		{Name: "zeta", Source: "img:z2", Digest: "sha256:2", SizeBytes: 20, CreatedAt: at.Add(time.Second)},
	} {
		if err := s.PutTemplate(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.GetTemplate(ctx, "zeta")
	if err != nil {
		t.Fatal(err)
	}
	want := &TemplateRecord{Name: "zeta", Source: "img:z2", Digest: "sha256:2", SizeBytes: 20, CreatedAt: at.Add(time.Second)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want the replacement %+v", got, want)
	}
	list, err := s.ListTemplates(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "alpha" || list[1].Name != "zeta" {
		t.Fatalf("list = %v, %v", list, err)
	}
	if err := s.DeleteTemplate(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	wantClass(t, s.DeleteTemplate(ctx, "alpha"), errdefs.ErrNotFound)
	_, err = s.GetTemplate(ctx, "alpha")
	wantClass(t, err, errdefs.ErrNotFound)
	if list, err := s.ListTemplates(ctx); err != nil || len(list) != 1 {
		t.Fatalf("after delete: %v, %v", list, err)
	}
}

func TestEgressRecords(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	recs := []node.EgressRecord{
		{SessionID: "a", Time: now, Kind: "connect", Host: "x.test", Addr: "198.51.100.1", Port: 443, BytesUp: 10, BytesDown: 90, Decision: "allow"},
		{SessionID: "a", Time: now, Kind: "dns", Host: "evil\x00\n" + strings.Repeat("y", 400), Port: 53, Decision: "deny", Reason: "name not in the allow-list"},
		{SessionID: "b", Time: now, Kind: "http", Host: "z.test", Port: 80, BytesUp: 1, BytesDown: 2, Decision: "allow"},
	}
	if err := s.AddEgress(ctx, recs); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListEgress(ctx, "a", 0, 10)
	if err != nil || len(got) != 2 {
		t.Fatalf("ListEgress: %v %v", got, err)
	}
	if got[0].Host != "x.test" || got[0].BytesDown != 90 || !got[0].Time.Equal(now) {
		t.Errorf("first record: %+v", got[0])
	}
	if h := got[1].Host; len(h) != 255 || strings.ContainsAny(h, "\x00\n") {
		t.Errorf("hostile host name stored as %q", h)
	}
	if page, _ := s.ListEgress(ctx, "a", 1, 10); len(page) != 1 || page[0].Kind != "dns" {
		t.Errorf("skip 1: %+v", page)
	}
	if n, err := s.EgressBytes(ctx, "a"); err != nil || n != 100 {
		t.Errorf("EgressBytes(a) = %d %v, want 100", n, err)
	}
	if n, err := s.CountEgress(ctx, "a"); err != nil || n != 2 {
		t.Errorf("CountEgress(a) = %d %v, want 2", n, err)
	}
	old := []node.EgressRecord{{SessionID: "c", Time: now.Add(-48 * time.Hour), Kind: "dns", Decision: "deny"}}
	if err := s.AddEgress(ctx, old); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneEgress(ctx, now.Add(-24*time.Hour)); err != nil || n != 1 {
		t.Errorf("PruneEgress = %d %v, want 1", n, err)
	}
}

// TestProvisionalSnapshots: a provisional snapshot reads back as one;
// KeepSnapshot makes it permanent; ExpireSnapshot makes it permanent and
// sets its expiry, keeping an earlier one; both are not-found for an
// unknown id.
func TestProvisionalSnapshots(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	now := time.UnixMilli(1_800_000_000_000).UTC()
	for _, sn := range []*node.Snapshot{
		{ID: "p1", SessionID: "s", Template: "base", Storage: "btrfs", CreatedAt: now, Tenant: DefaultTenant, Provisional: true},
		{ID: "p2", SessionID: "s", Template: "base", Storage: "btrfs", CreatedAt: now, Tenant: DefaultTenant, Provisional: true},
		{ID: "p3", SessionID: "s", Template: "base", Storage: "btrfs", CreatedAt: now, Tenant: DefaultTenant, Provisional: true,
			ExpiresAt: now.Add(time.Minute)},
	} {
		if err := s.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.GetSnapshot(ctx, "p1"); err != nil || !got.Provisional {
		t.Fatalf("provisional snapshot read back as %+v (%v)", got, err)
	}
	if err := s.KeepSnapshot(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSnapshot(ctx, "p1"); got.Provisional || !got.ExpiresAt.IsZero() {
		t.Fatalf("kept snapshot %+v, want permanent without expiry", got)
	}
	if err := s.ExpireSnapshot(ctx, "p2", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSnapshot(ctx, "p2"); got.Provisional || !got.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Fatalf("expired snapshot %+v, want permanent, expiring in an hour", got)
	}
	if err := s.ExpireSnapshot(ctx, "p3", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSnapshot(ctx, "p3"); !got.ExpiresAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("snapshot expiring sooner got expiry %v, want its own %v", got.ExpiresAt, now.Add(time.Minute))
	}
	wantClass(t, s.KeepSnapshot(ctx, "nope"), errdefs.ErrNotFound)
	wantClass(t, s.ExpireSnapshot(ctx, "nope", now), errdefs.ErrNotFound)
}
