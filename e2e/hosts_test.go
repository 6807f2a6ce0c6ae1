package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestCLIHosts proves a daemon started with no fleet flags is a fleet of
// one: `forkbox hosts` lists it ready and placeable with its API address,
// tiers and capacity; its heartbeat advances; the JetStream store is in
// the data directory; and the route is admin only.
func TestCLIHosts(t *testing.T) {
	need(t)
	out, errOut, code := forkbox(t, "", "hosts", "--json")
	if code != 0 {
		t.Fatalf("forkbox hosts --json: exit %d: %s", code, errOut)
	}
	var list client.HostList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("forkbox hosts --json: %v: %s", err, out)
	}
	if list.Self != "local" || len(list.Hosts) != 1 {
		t.Fatalf("hosts %+v, want this daemon alone as local", list)
	}
	h := list.Hosts[0]
	if h.ID != "local" || h.State != "ready" || !h.Placeable || h.API != env.d.URL || !slices.Contains(h.Tiers, "runc") ||
		h.SessionSlots <= 0 || h.CPUs <= 0 || h.MemoryMB <= 0 || h.Version == "" {
		t.Fatalf("host record %+v: want local, ready, placeable, API %s, runc, its capacity", h, env.d.URL)
	}
	// The heartbeat is rewritten every 2 s.
	first := h.Heartbeat
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := env.c.Hosts(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Hosts) == 1 && l.Hosts[0].Heartbeat.After(first) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heartbeat still %v after 20 s", first)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, errOut, code = forkbox(t, "", "hosts")
	if code != 0 || !strings.Contains(out, "local *") || !strings.Contains(out, "ready") || !strings.Contains(out, env.d.URL) {
		t.Fatalf("forkbox hosts: exit %d, table %q, stderr %q", code, out, errOut)
	}
	if fi, err := os.Stat(filepath.Join(env.dataDir, "fleet", "jetstream")); err != nil || !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("JetStream store in the data directory: %v %v", fi, err)
	}
	_, key, _ := newTenant(t, env.c, "hosts", client.TenantPolicy{})
	if status, _, body := rawCall(t, key, http.MethodGet, "/v1/hosts", nil); status != http.StatusForbidden {
		t.Fatalf("GET /v1/hosts with a tenant key: %d %s, want 403", status, body)
	}
}
