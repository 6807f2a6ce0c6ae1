package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// tenantSeq makes tenant names unique within a test run.
var tenantSeq struct {
	sync.Mutex
	n int
}

// newTenant creates a tenant with policy p (through the install's admin
// key) and one key of it; it returns the tenant's name and a client with
// that key. The tenant and its sessions are removed when the test ends.
func newTenant(t *testing.T, c *client.Client, prefix string, p client.TenantPolicy) (string, string, *client.Client) {
	t.Helper()
	need(t)
	tenantSeq.Lock()
	tenantSeq.n++
	name := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%100000, tenantSeq.n)
	tenantSeq.Unlock()
	ctx := ctxFor(t, time.Minute)
	if _, err := c.CreateTenant(ctx, name, p); err != nil {
		t.Fatalf("create tenant %s: %v", name, err)
	}
	k, err := c.CreateKey(ctx, name, "test", false)
	if err != nil {
		t.Fatalf("create key for %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.DeleteTenant(ctx, name, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("delete tenant %s: %v", name, err)
		}
	})
	return name, k.Secret, client.New(c.BaseURL(), k.Secret, nil)
}

// rawCall sends one request with key to the shared daemon and returns
// status, headers and body.
func rawCall(t *testing.T, key, method, path string, body any) (int, http.Header, []byte) {
	t.Helper()
	return rawCallAt(t, env.d.URL, key, method, path, body, nil)
}

// rawCallAt is rawCall to the daemon at base, with extra headers. A
// string body is sent as is, any other non-nil body as JSON; key "" sends
// no credentials.
func rawCallAt(t *testing.T, base, key, method, path string, body any, header map[string]string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctxFor(t, time.Minute), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-API-Key", key)
	}
	if _, isJSON := body.(string); body != nil && !isJSON {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// problemType is the type of a problem+json body ("" if it is none).
func problemType(b []byte) string {
	var p v1.Problem
	_ = json.Unmarshal(b, &p)
	return p.Type
}

// TestTenantCannotReachAnotherTenant proves every endpoint that takes a
// session, snapshot or template id answers 404 to another tenant's key
// (forkbox and E2B APIs alike), lists show only the caller's own, admin
// endpoints are 403 to a tenant key, and the owner's session is untouched.
func TestTenantCannotReachAnotherTenant(t *testing.T) {
	_, _, owner := newTenant(t, env.c, "owner", client.TenantPolicy{EgressAllow: []string{"*"}})
	_, intruderKey, intruder := newTenant(t, env.c, "intruder", client.TenantPolicy{})
	ctx := ctxFor(t, 2*time.Minute)
	s, _, err := owner.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer owner.DeleteSession(context.Background(), s.ID)
	if _, err := owner.Upload(ctx, s.ID, "/home/user/secret.txt", strings.NewReader("owner's"), 7, ""); err != nil {
		t.Fatal(err)
	}
	sn, err := owner.SnapshotWith(ctx, s.ID, client.SnapshotRequest{Name: "owners-snap"})
	if err != nil {
		t.Fatal(err)
	}
	id, snap := s.ID, sn.ID
	exec := map[string]any{"argv": []string{"id"}}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/v1/sessions/" + id, nil},
		{"DELETE", "/v1/sessions/" + id, nil},
		{"POST", "/v1/sessions/" + id + "/timeout", map[string]any{"timeout_s": 5}},
		{"GET", "/v1/sessions/" + id + "/usage", nil},
		{"GET", "/v1/sessions/" + id + "/egress", nil},
		{"POST", "/v1/sessions/" + id + "/pause", nil},
		{"POST", "/v1/sessions/" + id + "/resume", nil},
		{"POST", "/v1/sessions/" + id + "/snapshot", map[string]any{}},
		{"POST", "/v1/sessions/" + id + "/fork", map[string]any{"count": 1}},
		{"POST", "/v1/sessions/" + id + "/exec", exec},
		{"GET", "/v1/sessions/" + id + "/processes", nil},
		{"GET", "/v1/sessions/" + id + "/processes/1/stream", nil},
		{"POST", "/v1/sessions/" + id + "/processes/1/signal", map[string]any{"signal": 9}},
		{"DELETE", "/v1/sessions/" + id + "/processes/1", nil},
		{"POST", "/v1/sessions/" + id + "/processes/1/stdin", map[string]any{"data": "eA=="}},
		{"PUT", "/v1/sessions/" + id + "/files/home/user/secret.txt", "overwritten"},
		{"GET", "/v1/sessions/" + id + "/files/home/user/secret.txt", nil},
		{"DELETE", "/v1/sessions/" + id + "/files/home/user/secret.txt", nil},
		{"GET", "/v1/sessions/" + id + "/fs/stat?path=/home/user/secret.txt", nil},
		{"GET", "/v1/sessions/" + id + "/fs/list?path=/home/user", nil},
		{"POST", "/v1/sessions/" + id + "/fs/mkdir", map[string]any{"path": "/home/user/x"}},
		{"POST", "/v1/sessions/" + id + "/fs/move", map[string]any{"source": "/home/user/secret.txt", "destination": "/tmp/s"}},
		{"GET", "/v1/snapshots/" + snap, nil},
		{"GET", "/v1/snapshots/owners-snap", nil},
		{"DELETE", "/v1/snapshots/" + snap + "?force=true", nil},
		{"POST", "/v1/snapshots/" + snap + "/fork", map[string]any{"count": 1}},
		{"POST", "/v1/snapshots/owners-snap/fork", map[string]any{"count": 1}},
		// E2B's control plane.
		{"GET", "/sandboxes/" + id, nil},
		{"DELETE", "/sandboxes/" + id, nil},
		{"POST", "/sandboxes/" + id + "/timeout", map[string]any{"timeout": 5}},
		{"POST", "/sandboxes/" + id + "/pause", nil},
		{"POST", "/sandboxes/" + id + "/resume", map[string]any{}},
		{"POST", "/sandboxes/" + id + "/connect", map[string]any{"timeout": 30}},
		{"POST", "/v2/sandboxes/" + id + "/connect", map[string]any{"timeout": 30}},
		{"GET", "/sandboxes/" + id + "/metrics", nil},
		{"POST", "/sandboxes/" + id + "/snapshots", map[string]any{}},
		{"POST", "/sandboxes/" + id + "/fork", map[string]any{}},
		{"DELETE", "/templates/" + snap, nil},
	} {
		status, _, body := rawCall(t, intruderKey, c.method, c.path, c.body)
		if status != http.StatusNotFound {
			t.Errorf("%s %s as another tenant: %d %s, want 404", c.method, c.path, status, body)
		}
	}
	// Creating from the other tenant's snapshot (by id or name) is as if it
	// did not exist; E2B's create takes snapshots as templateID.
	for _, ref := range []string{snap, "owners-snap"} {
		status, _, body := rawCall(t, intruderKey, "POST", "/v1/sessions", map[string]any{"snapshot": ref})
		if status != http.StatusBadRequest || !strings.Contains(string(body), "does not exist") {
			t.Errorf("create from another tenant's snapshot %s: %d %s", ref, status, body)
		}
		status, _, body = rawCall(t, intruderKey, "POST", "/sandboxes", map[string]any{"templateID": ref})
		if status == http.StatusCreated || status == http.StatusOK {
			t.Errorf("E2B create from another tenant's snapshot %s: %d %s", ref, status, body)
		}
	}
	// Lists show none of it.
	if ss, err := intruder.ListSessions(ctx, client.ListOptions{All: true}); err != nil || len(ss) != 0 {
		t.Errorf("intruder's session list: %v %v", ss, err)
	}
	if sns, err := intruder.Snapshots(ctx); err != nil || len(sns) != 0 {
		t.Errorf("intruder's snapshot list: %v %v", sns, err)
	}
	if status, _, body := rawCall(t, intruderKey, "GET", "/sandboxes", nil); status != 200 || strings.Contains(string(body), id) {
		t.Errorf("E2B list as intruder: %d %s", status, body)
	}
	if status, _, body := rawCall(t, intruderKey, "GET", "/snapshots", nil); status != 200 || strings.Contains(string(body), snap) {
		t.Errorf("E2B snapshot list as intruder: %d %s", status, body)
	}
	// Admin endpoints refuse a tenant key.
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/tenants"}, {"POST", "/v1/tenants"}, {"GET", "/v1/keys"}, {"DELETE", "/v1/keys/default-x"},
		{"POST", "/v1/tenants/default/keys"}, {"PUT", "/v1/pools/base"}, {"GET", "/metrics"},
		{"DELETE", "/v1/tenants/default"},
	} {
		if status, _, body := rawCall(t, intruderKey, c.method, c.path, map[string]any{}); status != http.StatusForbidden {
			t.Errorf("%s %s with a tenant key: %d %s, want 403", c.method, c.path, status, body)
		}
	}
	// Audit: a tenant key reads only its own tenant's records.
	if status, _, _ := rawCall(t, intruderKey, "GET", "/v1/audit?tenant=default", nil); status != http.StatusForbidden {
		t.Errorf("intruder reading the default tenant's audit: %d, want 403", status)
	}
	list, err := intruder.Audit(ctx, client.AuditFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.Records {
		if r.Tenant == "" || strings.HasPrefix(r.Tenant, "owner") || r.Tenant == "default" {
			t.Errorf("intruder sees a record of tenant %q: %+v", r.Tenant, r)
		}
	}
	if len(list.Records) == 0 {
		t.Error("the intruder's refused attempts left no audit records")
	}
	// The owner's session and file are untouched.
	got, err := owner.GetSession(ctx, s.ID)
	if err != nil || got.State != "running" {
		t.Fatalf("owner's session after the attempts: %+v %v", got, err)
	}
	rc, err := owner.Download(ctx, s.ID, "/home/user/secret.txt", "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "owner's" {
		t.Fatalf("owner's file is %q", b)
	}
	if _, err := owner.GetSnapshot(ctx, snap); err != nil {
		t.Fatalf("owner's snapshot: %v", err)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// TestTenantTemplates proves an imported template is its tenant's: another
// tenant cannot see, use, delete or shadow it (404 / "does not exist"),
// the base template stays everyone's, and only an admin imports a shared
// template that every tenant sees.
func TestTenantTemplates(t *testing.T) {
	img := busyboxImage(t)
	_, _, owner := newTenant(t, env.c, "tplowner", client.TenantPolicy{})
	_, intruderKey, intruder := newTenant(t, env.c, "tplintruder", client.TenantPolicy{})
	ctx := ctxFor(t, 2*time.Minute)
	name := "own-" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	if _, err := owner.ImportTemplate(ctx, name, "", bytes.NewReader(img), int64(len(img))); err != nil {
		t.Fatal(err)
	}
	defer owner.DeleteTemplate(context.Background(), name)
	for _, c := range []struct {
		method, path string
		body         any
		status       int
	}{
		{"GET", "/v1/templates/" + name, nil, 404},
		{"DELETE", "/v1/templates/" + name, nil, 404},
		{"POST", "/v1/sessions", map[string]any{"template": name}, 400},
		{"POST", "/sandboxes", map[string]any{"templateID": name}, 404},
		{"PUT", "/v1/templates/shared-x?shared=true", nil, 403},
	} {
		if status, _, body := rawCall(t, intruderKey, c.method, c.path, c.body); status != c.status {
			t.Errorf("%s %s as another tenant: %d %s, want %d", c.method, c.path, status, body, c.status)
		}
	}
	ts, err := intruder.Templates(ctx)
	if err != nil || hasTemplate(ts, name) || !hasTemplate(ts, "base") {
		t.Fatalf("intruder's templates: %+v %v", ts, err)
	}
	s, _, err := owner.CreateSession(ctx, client.CreateRequest{Template: name}, "")
	if err != nil {
		t.Fatalf("owner's create on its template: %v", err)
	}
	owner.DeleteSession(ctx, s.ID)
}

// TestDeleteTenantRacingCreates proves deleting a tenant while its keys
// keep creating sessions leaves none of them running: creates under way
// are waited for and ended, later ones are refused (its keys are gone),
// and its name cannot be taken again.
func TestDeleteTenantRacingCreates(t *testing.T) {
	name, key, _ := newTenant(t, env.c, "doomed", client.TenantPolicy{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				status, _, _ := rawCall(t, key, "POST", "/v1/sessions", map[string]any{"memory_mb": 64, "pids": 64})
				if status == http.StatusUnauthorized || status == http.StatusForbidden {
					return
				}
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	ctx := ctxFor(t, 4*time.Minute)
	if err := env.c.DeleteTenant(ctx, name, true); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if n := env.d.Manager().TenantSessions(name); n != 0 {
		t.Fatalf("%d sessions of the deleted tenant are left", n)
	}
	if status, _, _ := rawCall(t, key, "GET", "/v1/sessions", nil); status != http.StatusUnauthorized {
		t.Fatalf("the deleted tenant's key: %d, want 401", status)
	}
	if _, err := env.c.CreateTenant(ctx, name, client.TenantPolicy{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("taking a deleted tenant's name: %v, want conflict", err)
	}
}
