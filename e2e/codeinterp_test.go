package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestCodeInterpreterSDK runs the unmodified @e2b/code-interpreter SDK
// (npm, pinned in compat/code-interpreter/package-lock.json) against the
// test daemon with a tenant's key: sandboxes of its default template
// (code-interpreter-v1), Python state between calls, streamed logs, charts,
// pandas HTML, contexts, bash and JavaScript, timeouts interrupting cells.
// Afterwards the tenant's audit trail holds the code calls with the hash
// of every cell.
func TestCodeInterpreterSDK(t *testing.T) {
	need(t)
	dir, npm := npmSuite(t, "code-interpreter", "@e2b/code-interpreter")
	_, key, tc := newTenant(t, env.c, "ci", client.TenantPolicy{})
	environ := []string{"E2B_API_URL=" + env.d.URL, "E2B_SANDBOX_URL=" + env.d.URL, "E2B_API_KEY=" + key}
	var live io.Writer
	if testing.Verbose() {
		live = os.Stdout
	}
	out, err := runNPM(ctxFor(t, 8*time.Minute), dir, npm, environ, live, "test")
	if err != nil {
		t.Fatalf("code-interpreter SDK: npm test: %v\n%s", err, out)
	}
	t.Logf("code-interpreter SDK: %s", summary(out))
	var buf bytes.Buffer
	if err := tc.ExportAudit(ctxFor(t, time.Minute), client.AuditFilter{}, &buf); err != nil {
		t.Fatal(err)
	}
	cells, contexts := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r client.AuditRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if r.Kind != "code" {
			continue
		}
		if r.Detail["path"] == "/execute" {
			if s, _ := r.Detail["code_sha256"].(string); len(s) != 64 {
				t.Errorf("an execute record without the cell's hash: %v", r.Detail)
			}
			cells++
		} else {
			contexts++
		}
	}
	if cells < 20 || contexts < 5 {
		t.Errorf("audit: %d execute records and %d context records, want at least 20 and 5", cells, contexts)
	}
}

// TestCodeServiceAuth checks the gate of port 49999 as E2B's proxy keeps
// it: every call needs the sandbox's traffic access token (403 without or
// with another sandbox's), /execute also the envd access token (401), an
// unknown path of the service is 404; with both a cell runs and streams.
func TestCodeServiceAuth(t *testing.T) {
	need(t)
	a, b := createCodeSandbox(t), createCodeSandbox(t)
	call := func(method, path, traffic, envd, body string) (int, string) {
		h := map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": "49999", "Content-Type": "application/json"}
		if traffic != "" {
			h["E2B-Traffic-Access-Token"] = traffic
		}
		if envd != "" {
			h["X-Access-Token"] = envd
		}
		status, _, out := rawRequest(t, method, path, body, "", h)
		return status, out
	}
	tok := a.TrafficAccessToken
	cell := `{"code":"print('hi')\n6 * 7"}`
	for _, c := range []struct {
		what                        string
		method, path, traffic, envd string
		want                        int
	}{
		{"no traffic token", "GET", "/contexts", "", "", http.StatusForbidden},
		{"another sandbox's traffic token", "GET", "/contexts", b.TrafficAccessToken, "", http.StatusForbidden},
		{"execute without the envd token", "POST", "/execute", tok, "", http.StatusUnauthorized},
		{"execute with another sandbox's envd token", "POST", "/execute", tok, b.EnvdAccessToken, http.StatusUnauthorized},
		{"an unknown path", "GET", "/kernels", tok, "", http.StatusNotFound},
		{"health", "GET", "/health", tok, "", http.StatusOK},
	} {
		if status, out := call(c.method, c.path, c.traffic, c.envd, cell); status != c.want {
			t.Errorf("%s: %d %s, want %d", c.what, status, out, c.want)
		}
	}
	status, out := call("POST", "/execute", tok, a.EnvdAccessToken, cell)
	if status != http.StatusOK || !strings.Contains(out, `"text":"hi\n"`) || !strings.Contains(out, `"text":"42"`) || !strings.HasSuffix(strings.TrimSpace(out), `{"type":"end_of_execution"}`) {
		t.Fatalf("execute: %d %s", status, out)
	}
	// The sandbox's user runs the kernel, with the sandbox's environment.
	status, out = call("POST", "/execute", tok, a.EnvdAccessToken, `{"code":"import getpass, os; (getpass.getuser(), os.getcwd())"}`)
	if status != http.StatusOK || !strings.Contains(out, `('user', '/home/user')`) {
		t.Errorf("whoami: %d %s", status, out)
	}
}

// codeSandbox is what E2B's create returns, as far as these tests read it.
type codeSandbox struct {
	SandboxID          string `json:"sandboxID"`
	EnvdAccessToken    string `json:"envdAccessToken"`
	TrafficAccessToken string `json:"trafficAccessToken"`
}

// createCodeSandbox creates a sandbox of template code-interpreter-v1
// through POST /v2/sandboxes, checks it has a traffic access token, and
// kills it when the test ends.
func createCodeSandbox(t *testing.T) codeSandbox {
	t.Helper()
	status, body := e2bCall(t, "POST", "/v2/sandboxes", `{"templateID":"code-interpreter-v1","timeout":120}`)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	var sb codeSandbox
	if err := json.Unmarshal(body, &sb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e2bCall(t, "DELETE", "/sandboxes/"+sb.SandboxID, "") })
	if len(sb.TrafficAccessToken) < 32 || sb.TrafficAccessToken == sb.EnvdAccessToken {
		t.Fatalf("create returned no traffic access token of its own: %s", body)
	}
	return sb
}

// runCode runs code in session id through forkbox's API (the Go client)
// and returns the execution.
func runCode(t *testing.T, id string, req client.CodeRequest) *client.Execution {
	t.Helper()
	ex, err := env.c.RunCode(ctxFor(t, 3*time.Minute), id, req, nil)
	if err != nil {
		t.Fatalf("run code %q in %s: %v", truncate(req.Code, 60), id, err)
	}
	return ex
}

// TestCodeAPI drives a session's code-execution service through forkbox's
// own API: a Python kernel's state, a context of another language, the
// errors of bad calls as problems, the cell on the audit trail before it
// ran, and a files snapshot's fork in the runc tier, which starts a fresh
// kernel (the tier keeps no memory).
func TestCodeAPI(t *testing.T) {
	s := newSession(t, client.CreateRequest{Template: "code-interpreter-v1"})
	runCode(t, s.ID, client.CodeRequest{Code: "import numpy as np\nv = np.arange(4)"})
	if ex := runCode(t, s.ID, client.CodeRequest{Code: "int(v.sum())"}); ex.Text != "6" || ex.Error != nil {
		t.Fatalf("v.sum(): %+v", ex)
	}
	cc, err := env.c.CreateCodeContext(ctxFor(t, time.Minute), s.ID, client.CodeContextRequest{Language: "bash", Cwd: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	if ex := runCode(t, s.ID, client.CodeRequest{Code: "pwd; id -un", ContextID: cc.ID}); ex.Stdout != "/tmp\nuser\n" {
		t.Errorf("bash context: %+v", ex)
	}
	// pip installs without flags (PEP 668 does not refuse: the default
	// virtual environment is first on PATH), into the environment the
	// kernel runs, so the running kernel imports it.
	sh(t, s.ID, `mkdir -p /tmp/fbpkg/fbdemo && echo 'VALUE = 42' > /tmp/fbpkg/fbdemo/__init__.py && `+
		`printf '[project]\nname = "fbdemo"\nversion = "0.1"\n[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n' > /tmp/fbpkg/pyproject.toml && `+
		`pip install --no-build-isolation --no-index /tmp/fbpkg`)
	if ex := runCode(t, s.ID, client.CodeRequest{Code: "import fbdemo, sys\n(fbdemo.VALUE, sys.prefix)"}); ex.Text != "(42, '/home/user/.venv')" {
		t.Errorf("a package pip installed, in the kernel: %+v", ex)
	}
	for _, c := range []struct {
		req    client.CodeRequest
		status int
	}{
		{client.CodeRequest{Code: "1", ContextID: "nope"}, http.StatusNotFound},
		{client.CodeRequest{Code: "1", Language: "cobol"}, http.StatusBadRequest},
		{client.CodeRequest{Code: "1", ContextID: cc.ID, Language: "bash"}, http.StatusBadRequest},
	} {
		_, err := env.c.RunCode(ctxFor(t, time.Minute), s.ID, c.req, nil)
		var apiErr *client.Error
		if !errors.As(err, &apiErr) || apiErr.Status != c.status {
			t.Errorf("%+v: %v, want a %d problem", c.req, err, c.status)
		}
	}
	if _, err := env.c.RunCode(ctxFor(t, time.Minute), "nosuchsession0000000", client.CodeRequest{Code: "1"}, nil); err == nil {
		t.Error("a cell ran in a session that does not exist")
	}
	var buf bytes.Buffer
	if err := env.c.ExportAudit(ctxFor(t, time.Minute), client.AuditFilter{Session: s.ID}, &buf); err != nil {
		t.Fatal(err)
	}
	if starts := strings.Count(buf.String(), `"kind":"code.start"`); starts < 3 {
		t.Errorf("%d code.start records for 3 cells run:\n%s", starts, buf.String())
	}

	sn, err := env.c.Snapshot(ctxFor(t, time.Minute), s.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true) })
	for _, f := range forkAll(t, sn.ID, 1) {
		if ex := runCode(t, f.ID, client.CodeRequest{Code: "v"}); ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("a runc fork's kernel has its source's state: %+v", ex)
		}
		if ex := runCode(t, f.ID, client.CodeRequest{Code: "1 + 1"}); ex.Text != "2" {
			t.Errorf("a runc fork's kernel: %+v", ex)
		}
	}
}

// TestGVisorCodeForkKeepsKernel: in the gVisor tier a memory snapshot of a
// sandbox keeps its kernel, so every fork of it goes on with the source's
// variables (the kernel's sockets live in the sandbox's memory, which
// checkpoints), and each fork's state is then its own.
func TestGVisorCodeForkKeepsKernel(t *testing.T) {
	needGVisor(t)
	src := newSession(t, client.CreateRequest{Template: "code-interpreter-v1", Isolation: "gvisor", MemoryMB: 1024})
	runCode(t, src.ID, client.CodeRequest{Code: "import numpy as np\nv = np.arange(5)\nn = 0"})
	sn := memorySnapshot(t, src.ID)
	forks := forkAll(t, sn.ID, 2)
	for i, f := range forks {
		ex := runCode(t, f.ID, client.CodeRequest{Code: fmt.Sprintf("n += %d\nint(v.sum()) * 10 + n", i+1)})
		if want := fmt.Sprint(100 + i + 1); ex.Text != want || ex.Error != nil {
			t.Errorf("fork %d: %+v, want %s (the kernel's state from the snapshot)", i, ex, want)
		}
	}
	if ex := runCode(t, src.ID, client.CodeRequest{Code: "n"}); ex.Text != "0" {
		t.Errorf("the source saw a fork's change: n = %q", ex.Text)
	}
}
