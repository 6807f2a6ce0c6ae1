package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// rawRequest sends a request with the API key (unless key is "") and
// returns status, content type and body.
func rawRequest(t *testing.T, method, path, body, key string, header map[string]string) (int, string, string) {
	t.Helper()
	status, hdr, b := rawCallAt(t, env.d.URL, key, method, path, body, header)
	return status, hdr.Get("Content-Type"), string(b)
}

// TestAPIAuthentication proves every API call needs the key, given as a
// bearer token or X-API-Key.
func TestAPIAuthentication(t *testing.T) {
	need(t)
	for _, key := range []string{"", "fbx_wrong"} {
		code, ctype, body := rawRequest(t, "GET", "/v1/sessions", "", key, nil)
		if code != 401 || ctype != "application/problem+json" || !strings.Contains(body, "/problems/unauthenticated") {
			t.Errorf("key %q: %d %s %s", key, code, ctype, body)
		}
	}
	if code, _, _ := rawRequest(t, "GET", "/v1/sessions", "", "", map[string]string{"X-API-Key": env.key}); code != 200 {
		t.Errorf("X-API-Key: %d", code)
	}
	if code, _, _ := rawRequest(t, "GET", "/v1/info", "", env.key, nil); code != 200 {
		t.Errorf("bearer: %d", code)
	}
}

// TestAPIBadInput proves bad create requests get a 4xx problem naming the
// field, and leave no session, sandbox directory or container behind.
func TestAPIBadInput(t *testing.T) {
	need(t)
	before := sandboxArtifacts(t)
	cases := []struct{ body, field string }{
		{`{"template":"nope"}`, "template"},
		{`{"template":"../../etc"}`, "template"},
		{`{"cpu":-1}`, "cpu"},
		{`{"cpu":1000}`, "cpu"},
		{`{"memory_mb":-5}`, "memory_mb"},
		{`{"memory_mb":1000000000}`, "memory_mb"},
		{`{"pids":-1}`, "pids"},
		{`{"pids":99999999}`, "pids"},
		{`{"pids":16}`, "pids"}, // too few for the agent's own threads: it could never start
		{`{"timeout_s":-1}`, "timeout_s"},
		{`{"timeout_s":999999999}`, "timeout_s"},
		{`{"memory_mb":"lots"}`, "memory_mb"},
		{`{"env":{"A=B":"x"}}`, "env"},
		{`{"user":"Robert'); DROP"}`, "user"},
		{`{"user":"65536"}`, "user"}, // beyond the sandbox's 65536 ids
		{`{"user":"ghost"}`, "user"}, // not in the template: every exec would fail
		{`{"workdir":"/nonexistent"}`, "workdir"},
		{`{"workdir":"/etc/passwd"}`, "workdir"},
		{`{"workdir":"relative"}`, "workdir"},
		{`{"bogus":true}`, "bogus"},
		{`{"cpu":1`, "body"},
		{`{"cpu":1} {"cpu":2}`, "body"},
		{`[1,2]`, "body"},
	}
	for _, c := range cases {
		code, ctype, body := rawRequest(t, "POST", "/v1/sessions", c.body, env.key, nil)
		var p client.Error
		_ = json.Unmarshal([]byte(body), &p)
		if code != 400 || ctype != "application/problem+json" || p.Field != c.field || p.Type != "/problems/invalid-argument" {
			t.Errorf("%s: %d %s field %q, want 400 naming %q: %s", c.body, code, ctype, p.Field, c.field, body)
		}
	}
	if after := sandboxArtifacts(t); after != before {
		t.Errorf("bad requests left sandboxes behind: %d before, %d after", before, after)
	}
	// Unknown ids, paths and methods.
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/sessions/doesnotexist"}, {"DELETE", "/v1/sessions/doesnotexist"},
		{"POST", "/v1/sessions/doesnotexist/exec"}, {"GET", "/v1/nothing-here"},
	} {
		code, ctype, _ := rawRequest(t, r.method, r.path, `{"cmd":"true"}`, env.key, nil)
		if code != 404 || ctype != "application/problem+json" {
			t.Errorf("%s %s: %d %s, want 404 problem", r.method, r.path, code, ctype)
		}
	}
	if code, _, _ := rawRequest(t, "PATCH", "/v1/sessions", "", env.key, nil); code != 405 {
		t.Errorf("PATCH /v1/sessions: %d, want 405", code)
	}
	if code, _, body := rawRequest(t, "GET", "/problems/invalid-argument", "", "", nil); code != 200 || body == "" {
		t.Errorf("problem type document: %d", code)
	}
}

// sandboxArtifacts counts sandboxes on disk, in runc and in the store.
func sandboxArtifacts(t *testing.T) int {
	entries, _ := os.ReadDir(filepath.Join(env.dataDir, "sandboxes"))
	runcs, _ := os.ReadDir(filepath.Join(env.dataDir, "runc"))
	ss, err := env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)*10000 + len(runcs)*100 + len(ss)
}

// TestAPIIdempotentCreate proves a retried create with the same
// Idempotency-Key returns the same session, and a different body with that
// key is a conflict.
func TestAPIIdempotentCreate(t *testing.T) {
	need(t)
	ctx := ctxFor(t, time.Minute)
	key := "run-7f3a:step-" + time.Now().Format("150405.000000")
	req := client.CreateRequest{Metadata: map[string]string{"step": "12"}}
	a, replayed, err := env.c.CreateSession(ctx, req, key)
	if err != nil || replayed {
		t.Fatalf("first create: %v replayed=%v", err, replayed)
	}
	t.Cleanup(func() { env.c.DeleteSession(ctxFor(t, time.Minute), a.ID) })
	b, replayed, err := env.c.CreateSession(ctx, req, key)
	if err != nil || !replayed || b.ID != a.ID {
		t.Fatalf("retry: %v replayed=%v id %s vs %s", err, replayed, b.ID, a.ID)
	}
	req.CPU = 0.5
	if _, _, err := env.c.CreateSession(ctx, req, key); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("reused key with another body: %v, want conflict", err)
	}
}

// TestAPIListFilters proves metadata filters and state filters.
func TestAPIListFilters(t *testing.T) {
	tag := time.Now().Format("150405.000000")
	s := newSession(t, client.CreateRequest{Metadata: map[string]string{"owner": "list-test", "run": tag}})
	ss, err := env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{Metadata: map[string]string{"run": tag}})
	if err != nil || len(ss) != 1 || ss[0].ID != s.ID || ss[0].Metadata["owner"] != "list-test" {
		t.Fatalf("metadata filter: %+v %v", ss, err)
	}
	ss, _ = env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{Metadata: map[string]string{"run": "other"}})
	if len(ss) != 0 {
		t.Fatalf("non-matching filter returned %d sessions", len(ss))
	}
}
