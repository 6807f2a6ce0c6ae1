package e2e

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestTenantPolicyErrors proves each policy refusal with its problem type:
// a template off the approved list (400 image-not-approved), a size over
// the tenant's bounds (400 naming the field), an allow-list entry outside
// the egress ceiling or any network without one (403 egress-not-allowed),
// a session too big for the host (503 capacity-unavailable with
// Retry-After); each is a "policy" audit record with outcome denied.
func TestTenantPolicyErrors(t *testing.T) {
	_, key, _ := newTenant(t, env.c, "policy", client.TenantPolicy{
		Templates: []string{"base"}, MaxMemoryMB: 256, MaxCPU: 0.5, MaxTimeoutS: 600,
		EgressAllow: []string{"*.allowed.test:443", "198.51.100.0/24:8080"},
	})
	_, noNetKey, _ := newTenant(t, env.c, "nonet", client.TenantPolicy{})
	_, otherTplKey, _ := newTenant(t, env.c, "tpl", client.TenantPolicy{Templates: []string{"python-only"}})
	for _, c := range []struct {
		key    string
		body   map[string]any
		status int
		typ    string
		field  string
	}{
		{otherTplKey, map[string]any{}, 400, "/problems/image-not-approved", "template"},
		{key, map[string]any{"memory_mb": 512}, 400, "/problems/invalid-argument", "memory_mb"},
		{key, map[string]any{"cpu": 1}, 400, "/problems/invalid-argument", "cpu"},
		{key, map[string]any{"timeout_s": 3600}, 400, "/problems/invalid-argument", "timeout_s"},
		{key, map[string]any{"network": map[string]any{"allow": []string{"evil.test:443"}}}, 403, "/problems/egress-not-allowed", "network.allow[0]"},
		{key, map[string]any{"network": map[string]any{"allow": []string{"a.allowed.test:443", "allowed.test:443"}}}, 403, "/problems/egress-not-allowed", "network.allow[1]"},
		{key, map[string]any{"network": map[string]any{"allow": []string{"198.51.100.0/16:8080"}}}, 403, "/problems/egress-not-allowed", "network.allow[0]"},
		{key, map[string]any{"network": map[string]any{"allow": []string{"198.51.100.7/32:443"}}}, 403, "/problems/egress-not-allowed", "network.allow[0]"},
		{noNetKey, map[string]any{"network": map[string]any{"allow": []string{"allowed.test:80"}}}, 403, "/problems/egress-not-allowed", "network.allow[0]"},
		// 64 GiB is within the per-session limit but over this host's
		// capacity (the test daemon's is 48 GiB of memory limits).
		{noNetKey, map[string]any{"memory_mb": 65536}, 503, "/problems/capacity-unavailable", ""},
	} {
		status, hdr, body := rawCall(t, c.key, "POST", "/v1/sessions", c.body)
		if status != c.status || problemType(body) != c.typ || !strings.Contains(string(body), `"field":"`+c.field+`"`) && c.field != "" {
			t.Errorf("create %v: %d %s, want %d %s field %s", c.body, status, body, c.status, c.typ, c.field)
		}
		if status == 503 && hdr.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After")
		}
	}
	// Inside every bound: fine, and the network within the ceiling too.
	ctx := ctxFor(t, 2*time.Minute)
	tc := client.New(env.d.URL, key, nil)
	s, _, err := tc.CreateSession(ctx, client.CreateRequest{MemoryMB: 256, CPU: 0.5,
		Network: &client.Network{Allow: []string{"api.allowed.test:443", "198.51.100.40/32:8080"}}}, "")
	if err != nil {
		t.Fatalf("create within the policy: %v", err)
	}
	tc.DeleteSession(ctx, s.ID)
	list, err := tc.Audit(ctx, client.AuditFilter{Kind: "policy", Outcome: "denied"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Records) < 6 {
		t.Fatalf("%d denied policy records, want one per refusal (7): %+v", len(list.Records), list.Records)
	}
}

// TestTenantConcurrencyLimit proves parallel creates never get past a
// tenant's max_sessions: of eight at once with a limit of 3, exactly three
// succeed and the rest get 429 tenant-concurrency-exceeded with
// Retry-After; once one ends, a create succeeds again.
func TestTenantConcurrencyLimit(t *testing.T) {
	_, key, c := newTenant(t, env.c, "conc", client.TenantPolicy{MaxSessions: 3})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var created []string
	statuses := map[int]int{}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, hdr, body := rawCall(t, key, "POST", "/v1/sessions", map[string]any{})
			mu.Lock()
			defer mu.Unlock()
			statuses[status]++
			switch status {
			case http.StatusCreated:
				var s client.Session
				if err := jsonUnmarshal(body, &s); err == nil {
					created = append(created, s.ID)
				}
			case http.StatusTooManyRequests:
				if problemType(body) != "/problems/tenant-concurrency-exceeded" {
					t.Errorf("429 of type %s", problemType(body))
				}
				if n, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || n < 1 {
					t.Errorf("429 with Retry-After %q", hdr.Get("Retry-After"))
				}
			default:
				t.Errorf("create: %d %s", status, body)
			}
		}()
	}
	wg.Wait()
	ctx := ctxFor(t, 2*time.Minute)
	defer func() {
		for _, id := range created {
			c.DeleteSession(context.Background(), id)
		}
	}()
	if statuses[201] != 3 || statuses[429] != 5 {
		t.Fatalf("statuses %v, want 3 created and 5 refused", statuses)
	}
	if err := c.DeleteSession(ctx, created[0]); err != nil {
		t.Fatal(err)
	}
	s, _, err := c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatalf("create after one ended: %v", err)
	}
	created = append(created[1:], s.ID)
}

// TestTenantCPUBudget proves the daily CPU budget: a session spinning
// past its tenant's 3 CPU-seconds is ended by the monitor (reason quota,
// later calls 410 saying so) and new creates get 429
// cpu-budget-exhausted with Retry-After until the next UTC day.
func TestTenantCPUBudget(t *testing.T) {
	name, key, c := newTenant(t, env.c, "budget", client.TenantPolicy{CPUSecondsPerDay: 3})
	ctx := ctxFor(t, 3*time.Minute)
	s, _, err := c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{Cmd: "while :; do :; done"}); err != nil {
		t.Fatal(err)
	}
	got := waitEnded(t, c, s.ID, 90*time.Second)
	if got == nil || got.State != "terminated" || got.Reason != "quota" || !strings.Contains(got.Detail, "CPU budget") {
		t.Fatalf("session after spinning past the budget: %+v", got)
	}
	status, _, body := rawCall(t, key, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"argv": []string{"true"}})
	if status != http.StatusGone || !strings.Contains(string(body), "CPU budget") {
		t.Fatalf("exec in the ended session: %d %s", status, body)
	}
	status, hdr, body := rawCall(t, key, "POST", "/v1/sessions", map[string]any{})
	if status != http.StatusTooManyRequests || problemType(body) != "/problems/cpu-budget-exhausted" || hdr.Get("Retry-After") == "" {
		t.Fatalf("create past the budget: %d %s (Retry-After %q)", status, body, hdr.Get("Retry-After"))
	}
	tn, err := env.c.GetTenant(ctx, name)
	if err != nil || tn.CPUSecondsToday < 3 {
		t.Fatalf("tenant after the budget: %+v %v", tn, err)
	}
}

// TestTenantStorageQuotas proves max_snapshots and max_templates: past
// them a snapshot (also a session fork's) or an import is 429
// tenant-quota-exceeded, and deleting one makes room again.
func TestTenantStorageQuotas(t *testing.T) {
	img := busyboxImage(t)
	_, key, c := newTenant(t, env.c, "quota", client.TenantPolicy{MaxSnapshots: 1, MaxTemplates: 1})
	ctx := ctxFor(t, 2*time.Minute)
	s, _, err := c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.ID)
	sn, err := c.Snapshot(ctx, s.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	for path, body := range map[string]any{
		"/v1/sessions/" + s.ID + "/snapshot": map[string]any{},
		"/v1/sessions/" + s.ID + "/fork":     map[string]any{"count": 1},
	} {
		status, _, b := rawCall(t, key, "POST", path, body)
		if status != http.StatusTooManyRequests || problemType(b) != "/problems/tenant-quota-exceeded" {
			t.Errorf("POST %s at the snapshot quota: %d %s", path, status, b)
		}
	}
	if err := c.DeleteSnapshot(ctx, sn.ID, false); err != nil {
		t.Fatal(err)
	}
	sn, err = c.Snapshot(ctx, s.ID, 0)
	if err != nil {
		t.Fatalf("snapshot after deleting one: %v", err)
	}
	defer c.DeleteSnapshot(context.Background(), sn.ID, true)
	name := "quota-" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	if _, err := c.ImportTemplate(ctx, name, "", bytes.NewReader(img), int64(len(img))); err != nil {
		t.Fatal(err)
	}
	defer c.DeleteTemplate(context.Background(), name)
	status, _, body := rawCall(t, key, "PUT", "/v1/templates/"+name+"-2", string(img))
	if status != http.StatusTooManyRequests || problemType(body) != "/problems/tenant-quota-exceeded" {
		t.Fatalf("import at the template quota: %d %s", status, body)
	}
}
