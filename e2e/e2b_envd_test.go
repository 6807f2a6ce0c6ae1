package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// e2bSandbox is what the E2B create call returns, as far as these tests read it.
type e2bSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
	EnvdVersion     string `json:"envdVersion"`
}

// e2bCall sends an E2B control-plane request with the API key and returns
// the status and body.
func e2bCall(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	status, _, b := rawRequest(t, method, path, body, env.key, map[string]string{"Content-Type": "application/json"})
	return status, []byte(b)
}

// e2bCreate creates a sandbox through POST /v2/sandboxes and kills it when
// the test ends.
func e2bCreate(t *testing.T) e2bSandbox {
	t.Helper()
	status, body := e2bCall(t, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":120}`)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	var sb e2bSandbox
	if err := json.Unmarshal(body, &sb); err != nil {
		t.Fatal(err)
	}
	if sb.SandboxID == "" || len(sb.EnvdAccessToken) < 32 {
		t.Fatalf("create returned %s", body)
	}
	t.Cleanup(func() { e2bCall(t, "DELETE", "/sandboxes/"+sb.SandboxID, "") })
	return sb
}

// envdCall sends an envd request (E2b-Sandbox-Id) with token (none if
// empty) and extra headers, without the API key; it returns the status and
// body.
func envdCall(t *testing.T, id, token, method, path string, hdr map[string]string) (int, string) {
	t.Helper()
	h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"}
	if token != "" {
		h["X-Access-Token"] = token
	}
	for k, v := range hdr {
		h[k] = v
	}
	status, _, body := rawRequest(t, method, path, "", "", h)
	return status, body
}

// TestE2BEnvdProxyAuth checks the envd proxy's gate: only the sandbox's own
// access token opens it (not another sandbox's, not the API key), only
// envd's public endpoints and port are reachable, and a paused or killed
// sandbox answers 502 as E2B's edge does.
func TestE2BEnvdProxyAuth(t *testing.T) {
	need(t)
	a, b := e2bCreate(t), e2bCreate(t)
	if a.EnvdAccessToken == b.EnvdAccessToken {
		t.Fatal("two sandboxes share an envd access token")
	}
	files := "/files?path=" + url.QueryEscape("/etc/hostname")

	if st, body := envdCall(t, a.SandboxID, "", "GET", "/health", nil); st != http.StatusNoContent {
		t.Fatalf("health without a token: %d %s, want 204", st, body)
	}
	if st, body := envdCall(t, a.SandboxID, a.EnvdAccessToken, "GET", files, nil); st != http.StatusOK || body == "" {
		t.Fatalf("read with the sandbox's token: %d %q", st, body)
	}
	for name, tc := range map[string]struct {
		token string
		hdr   map[string]string
	}{
		"no token":               {},
		"another sandbox's":      {token: b.EnvdAccessToken},
		"the API key as token":   {token: env.key},
		"the API key as api key": {hdr: map[string]string{"X-API-KEY": env.key}},
		"bearer API key":         {hdr: map[string]string{"Authorization": "Bearer " + env.key}},
		"token with a suffix":    {token: a.EnvdAccessToken + "0"},
	} {
		if st, body := envdCall(t, a.SandboxID, tc.token, "GET", files, tc.hdr); st != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", name, st, body)
		}
	}
	// The agent's private endpoints stay private, token or not.
	for _, p := range []string{"/init", "/envs", "/metrics", "/process.Process/../init"} {
		if st, body := envdCall(t, a.SandboxID, a.EnvdAccessToken, "POST", p, nil); st != http.StatusNotFound {
			t.Errorf("POST %s: %d %s, want 404", p, st, body)
		}
	}
	// envd's GET /envs is public (E2B's code-interpreter server reads it):
	// the sandbox's environment as a JSON object, behind the token.
	if st, body := envdCall(t, a.SandboxID, a.EnvdAccessToken, "GET", "/envs", nil); st != http.StatusOK || !strings.HasPrefix(body, "{") {
		t.Errorf("GET /envs: %d %s, want 200 and an object", st, body)
	}
	if st, body := envdCall(t, a.SandboxID, "", "GET", "/envs", nil); st != http.StatusUnauthorized {
		t.Errorf("GET /envs without the token: %d %s, want 401", st, body)
	}
	if st, body := rawEnvdRequest(t, a, "POST /process.Process/%2e%2e/init HTTP/1.1"); st != http.StatusNotFound {
		t.Errorf("escaped dot segments: %d %s, want 404", st, body)
	}
	// A port nothing listens on in the sandbox: 502 (e2e/ports_test.go has the rest).
	if st, body := envdCall(t, a.SandboxID, a.EnvdAccessToken, "GET", files, map[string]string{"E2b-Sandbox-Port": "8080"}); st != http.StatusBadGateway {
		t.Errorf("port 8080: %d %s, want 502", st, body)
	}
	if st, body := envdCall(t, "nosuchsandbox0000000", a.EnvdAccessToken, "GET", "/health", nil); st != http.StatusBadGateway {
		t.Errorf("unknown sandbox: %d %s, want 502", st, body)
	}

	// Paused: 502 for health and calls, and the calls do not resume it.
	if st, body := e2bCall(t, "POST", "/sandboxes/"+a.SandboxID+"/pause", ""); st != http.StatusNoContent {
		t.Fatalf("pause: %d %s", st, body)
	}
	if st, body := envdCall(t, a.SandboxID, "", "GET", "/health", nil); st != http.StatusBadGateway {
		t.Errorf("health while paused: %d %s, want 502", st, body)
	}
	if st, body := envdCall(t, a.SandboxID, a.EnvdAccessToken, "GET", files, nil); st != http.StatusBadGateway {
		t.Errorf("read while paused: %d %s, want 502", st, body)
	}
	if st, body := envdCall(t, a.SandboxID, "", "GET", files, nil); st != http.StatusUnauthorized {
		t.Errorf("read without a token while paused: %d %s, want 401", st, body)
	}
	if st, body := e2bCall(t, "GET", "/sandboxes/"+a.SandboxID, ""); st != http.StatusOK || !strings.Contains(string(body), `"state":"paused"`) {
		t.Errorf("after envd calls on a paused sandbox: %d %s, want it still paused", st, body)
	}
	if st, body := e2bCall(t, "POST", "/v2/sandboxes/"+a.SandboxID+"/connect", `{"timeout":60}`); st != http.StatusCreated {
		t.Fatalf("connect (resume): %d %s, want 201", st, body)
	}
	if st, body := envdCall(t, a.SandboxID, a.EnvdAccessToken, "GET", files, nil); st != http.StatusOK {
		t.Errorf("read after resume: %d %s", st, body)
	}

	// Killed: 502 everywhere, also with the right token.
	if st, body := e2bCall(t, "DELETE", "/sandboxes/"+a.SandboxID, ""); st != http.StatusNoContent {
		t.Fatalf("kill: %d %s", st, body)
	}
	if st, body := envdCall(t, a.SandboxID, "", "GET", "/health", nil); st != http.StatusBadGateway {
		t.Errorf("health after kill: %d %s, want 502", st, body)
	}
	if st, body := envdCall(t, a.SandboxID, a.EnvdAccessToken, "GET", files, nil); st != http.StatusBadGateway {
		t.Errorf("read after kill: %d %s, want 502", st, body)
	}
	if st, body := e2bCall(t, "DELETE", "/sandboxes/"+a.SandboxID, ""); st != http.StatusNotFound {
		t.Errorf("second kill: %d %s, want 404", st, body)
	}
}

// rawEnvdRequest sends requestLine (which Go's client would normalise) as is,
// with sb's envd headers, and returns the status and body.
func rawEnvdRequest(t *testing.T, sb e2bSandbox, requestLine string) (int, string) {
	t.Helper()
	u, err := url.Parse(env.d.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "%s\r\nHost: %s\r\nE2b-Sandbox-Id: %s\r\nX-Access-Token: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
		requestLine, u.Host, sb.SandboxID, sb.EnvdAccessToken)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
