package agent

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/guest/wire"
)

// TestInitChangesDefaults proves POST /init replaces the default user and
// workdir and adds environment variables for later processes, and rejects
// malformed settings.
func TestInitChangesDefaults(t *testing.T) {
	a, c := newProcessAgent(t, wire.Config{DefaultUser: "root", Env: map[string]string{"KEEP": "1"}})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	post := func(body string) int {
		resp, err := http.Post(srv.URL+"/init", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(`{"envVars":{"NEW":"two words"},"defaultWorkdir":"/tmp"}`); code != http.StatusNoContent {
		t.Fatalf("init: %d", code)
	}
	o, err := runProcess(guardCtx(t), c, shell(`echo "$KEEP|$NEW|$(pwd)"`), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(o.stdout.String()); got != "1|two words|/tmp" {
		t.Fatalf("after init the process saw %q", got)
	}
	for _, bad := range []string{`{"envVars":{"A=B":"x"}}`, `{"defaultWorkdir":"relative"}`, `not json`} {
		if code := post(bad); code != http.StatusBadRequest {
			t.Errorf("init %s: %d, want 400", bad, code)
		}
	}
}
