package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/store"
)

// TestHandlersGetTheirDependencies proves New hands each handler type what
// it calls, over a real SQLite store and audit recorder: the tenant
// handlers create and list a key in the store, the create is audited, the
// audit handler reads that record back, a tenant key is refused on an
// admin route, and the host handler answers that metrics are off when New
// got none.
func TestHandlersGetTheirDependencies(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "admin1", Name: "admin", Tenant: store.DefaultTenant, Admin: true}, "admin-secret"); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(nil, st, nil, t.TempDir(), audit.New(st, log), nil, nil, log)
	do := func(method, target, secret, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+secret)
		if body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}

	w := do("POST", "/v1/tenants/"+store.DefaultTenant+"/keys", "admin-secret", `{"name":"ci"}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("create key: %d %s", w.Code, w.Body)
	}
	var nk v1.NewKey
	if err := json.Unmarshal(w.Body.Bytes(), &nk); err != nil || nk.Secret == "" || nk.Name != "ci" {
		t.Fatalf("new key %+v (%v)", nk, err)
	}

	w = do("GET", "/v1/keys", "admin-secret", "")
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), nk.ID) {
		t.Fatalf("list keys: %d %s", w.Code, w.Body)
	}

	w = do("GET", "/v1/audit?kind=key.create", "admin-secret", "")
	var al v1.AuditList
	if err := json.Unmarshal(w.Body.Bytes(), &al); err != nil || w.Code != http.StatusOK {
		t.Fatalf("audit: %d %s (%v)", w.Code, w.Body, err)
	}
	if len(al.Records) != 1 || al.Records[0].KeyID != "admin1" || al.Records[0].Outcome != audit.OK {
		t.Fatalf("audit records %+v", al.Records)
	}

	if p := problemOf(t, do("GET", "/v1/keys", nk.Secret, ""), http.StatusForbidden); p.Type != "/problems/permission-denied" {
		t.Fatalf("tenant key on an admin route: %+v", p)
	}
	if p := problemOf(t, do("GET", "/metrics", "admin-secret", ""), http.StatusServiceUnavailable); !strings.Contains(p.Detail, "metrics are off") {
		t.Fatalf("metrics off: %+v", p)
	}
}
