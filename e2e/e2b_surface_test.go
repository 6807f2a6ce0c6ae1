package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestE2BSurfaceTenancy proves the E2B calls added for the SDK's and the
// CLI's surface keep tenants apart and apply their policy: another
// tenant's template is not found by alias nor listed, an allow-list update
// outside the tenant's egress ceiling is 403 and changes nothing, and
// deleting a snapshot a running sandbox was made from leaves that sandbox
// its files (btrfs; overlay keeps the 409).
func TestE2BSurfaceTenancy(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 3*time.Minute)
	_, keyA, ca := newTenant(t, env.c, "e2bsa", client.TenantPolicy{EgressAllow: []string{"allowed.test:443", "allowed.test:80"}})
	_, keyB, _ := newTenant(t, env.c, "e2bsb", client.TenantPolicy{EgressAllow: []string{"*"}})
	e2b := func(key, method, path, body string) (int, string) {
		t.Helper()
		status, _, b := rawCallAt(t, env.d.URL, key, method, path, body, map[string]string{"Content-Type": "application/json"})
		return status, string(b)
	}

	// A's own template: A finds it (private), B does not.
	name := "e2bs-" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	img := busyboxImage(t)
	if _, err := ca.ImportTemplate(ctx, name, "", bytes.NewReader(img), int64(len(img))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ca.DeleteTemplate(ctxFor(t, time.Minute), name) })
	if st, body := e2b(keyA, "GET", "/templates/aliases/"+name, ""); st != http.StatusOK ||
		!strings.Contains(body, `"public":false`) {
		t.Errorf("the owner's alias lookup: %d %s", st, body)
	}
	if st, body := e2b(keyB, "GET", "/templates/aliases/"+name, ""); st != http.StatusNotFound ||
		!strings.Contains(body, `"code":404`) {
		t.Errorf("another tenant's alias lookup: %d %s, want 404 in E2B's JSON", st, body)
	}
	if _, body := e2b(keyB, "GET", "/templates", ""); strings.Contains(body, name) {
		t.Errorf("another tenant's template is listed: %s", body)
	}
	if _, body := e2b(keyA, "GET", "/templates", ""); !strings.Contains(body, `"templateID":"`+name+`"`) {
		t.Errorf("the owner's list lacks it: %s", body)
	}

	// The egress ceiling applies to updates as to creates.
	st, body := e2b(keyA, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":120,"network":{"allowOut":["allowed.test"]}}`)
	if st != http.StatusCreated {
		t.Fatalf("create with a network: %d %s", st, body)
	}
	var sb e2bSandbox
	if err := json.Unmarshal([]byte(body), &sb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e2b(keyA, "DELETE", "/sandboxes/"+sb.SandboxID, "") })
	if st, body := e2b(keyA, "PUT", "/sandboxes/"+sb.SandboxID+"/network", `{"allowOut":["other.test"]}`); st != http.StatusForbidden ||
		!strings.Contains(body, "outside this tenant's egress policy") {
		t.Errorf("an update past the ceiling: %d %s, want 403", st, body)
	}
	if st, body := e2b(keyB, "PUT", "/sandboxes/"+sb.SandboxID+"/network", `{"allowOut":["other.test"]}`); st != http.StatusNotFound {
		t.Errorf("another tenant's update: %d %s, want 404", st, body)
	}
	got, err := ca.GetSession(ctx, sb.SandboxID)
	if err != nil || got.Network == nil || strings.Join(got.Network.Allow, ",") != "allowed.test:80,allowed.test:443" {
		t.Errorf("the allow-list after refused updates: %+v (%v)", got.Network, err)
	}
	if st, body := e2b(keyA, "PUT", "/sandboxes/"+sb.SandboxID+"/network", `{"allowOut":["allowed.test"],"rules":{"x":[]}}`); st != http.StatusBadRequest {
		t.Errorf("rules: %d %s, want 400", st, body)
	}

	// A snapshot a running sandbox came from can be deleted (E2B's rule)
	// where the storage lets the sandbox keep its files.
	src := e2bCreate(t)
	if _, err := env.c.Upload(ctx, src.SandboxID, "/home/user/kept.txt", strings.NewReader("kept\n"), 5, ""); err != nil {
		t.Fatalf("write a file: %v", err)
	}
	st, raw := e2bCall(t, "POST", "/sandboxes/"+src.SandboxID+"/snapshots", `{}`)
	body = string(raw)
	if st != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", st, body)
	}
	var snap struct {
		SnapshotID string `json:"snapshotID"`
	}
	_ = json.Unmarshal([]byte(body), &snap)
	st, raw = e2bCall(t, "POST", "/v2/sandboxes", `{"templateID":"`+snap.SnapshotID+`","timeout":120}`)
	body = string(raw)
	if st != http.StatusCreated {
		t.Fatalf("create from the snapshot: %d %s", st, body)
	}
	var child e2bSandbox
	_ = json.Unmarshal([]byte(body), &child)
	t.Cleanup(func() { e2bCall(t, "DELETE", "/sandboxes/"+child.SandboxID, "") })
	st, raw = e2bCall(t, "DELETE", "/templates/"+snap.SnapshotID, "")
	body = string(raw)
	if os.Getenv("FORKBOX_STORAGE") == "overlay" {
		if st != http.StatusConflict {
			t.Fatalf("overlay: delete a snapshot a sandbox runs on: %d %s, want 409", st, body)
		}
		return
	}
	if st != http.StatusNoContent {
		t.Fatalf("delete a snapshot a sandbox runs on: %d %s, want 204", st, body)
	}
	if st, out := envdCall(t, child.SandboxID, child.EnvdAccessToken, "GET", "/files?path=/home/user/kept.txt", nil); st != http.StatusOK || out != "kept\n" {
		t.Fatalf("the sandbox's file after its snapshot was deleted: %d %q", st, out)
	}
	if st, _ := e2bCall(t, "DELETE", "/templates/"+snap.SnapshotID, ""); st != http.StatusNotFound {
		t.Fatalf("delete again: %d, want 404", st)
	}
}
