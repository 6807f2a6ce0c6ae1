package api

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/store"
)

// buildRequest is a POST /v1/templates/x/build whose multipart body has
// the given parts (name, content) in order.
func buildRequest(t *testing.T, parts ...string) *http.Request {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for i := 0; i+1 < len(parts); i += 2 {
		w, err := mw.CreateFormField(parts[i])
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(parts[i+1]))
	}
	mw.Close()
	r := httptest.NewRequest(http.MethodPost, "/v1/templates/x/build", &body)
	r.Header.Set("Content-Type", mw.FormDataContentType())
	r.Header.Set("Authorization", "Bearer admin-secret")
	return r
}

// TestBuildRefusesBadBodies proves the build route answers a body it
// cannot take with a problem naming what is wrong, before it needs a
// node or a catalog: not multipart (415), no spec or a spec part that is
// not the first, a spec that is not a build spec, no Dockerfile, and a
// Dockerfile with an unsupported instruction or a syntax error (400
// naming the field and the line).
func TestBuildRefusesBadBodies(t *testing.T) {
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
	w := serve(s, http.MethodPost, "/v1/templates/x/build", "Content-Type", "application/json", "Authorization", "Bearer admin-secret")
	problemOf(t, w, http.StatusUnsupportedMediaType)

	cases := []struct {
		parts       []string
		field, text string
	}{
		{nil, "spec", "no \"spec\" part"},
		{[]string{"context", "x"}, "spec", "comes first"},
		{[]string{"spec", `{"dockerfile": "FROM base", "nope": 1}`}, "spec", "unknown field"},
		{[]string{"spec", `{}`}, "dockerfile", "required"},
		{[]string{"spec", `{"dockerfile": "FROM base\nRUN true\nVOLUME /data\n"}`}, "dockerfile", "line 3: VOLUME is not supported"},
		{[]string{"spec", `{"dockerfile": "FROM base\nCOPY --chmod=755 a /a\n"}`}, "dockerfile", "line 2: COPY supports only --chown"},
		{[]string{"spec", `{"dockerfile": "FROM base\nENV A\"\n"}`}, "dockerfile", "line 2"},
	}
	for _, c := range cases {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, buildRequest(t, c.parts...))
		p := problemOf(t, rec, http.StatusBadRequest)
		if p.Field != c.field || !strings.Contains(p.Detail, c.text) {
			t.Errorf("parts %q: problem %+v, want field %q and %q", c.parts, p, c.field, c.text)
		}
	}
}
