package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/client"
)

// TestMCP drives forkbox's MCP server with the Go SDK's client, over the
// daemon's streamable HTTP endpoint (/mcp, the key as bearer token) and
// over `forkbox mcp` (stdio): tools listed, a sandbox made and used
// (commands with real output and exit codes, long output cut with a
// note, files, the file resource, stateful Python), snapshot and a fork
// of two whose children see the file, pause and resume, destroy; bad
// input and another tenant's sandbox are tool errors; a bad key is 401;
// and every HTTP tool call is an mcp.tool audit record.
func TestMCP(t *testing.T) {
	need(t)
	_, key, tc := newTenant(t, env.c, "mcp", client.TenantPolicy{})
	_, _, other := newTenant(t, env.c, "mcpother", client.TenantPolicy{})
	foreign, _, err := other.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("http", func(t *testing.T) {
		cs := connectMCP(t, &sdk.StreamableClientTransport{Endpoint: env.d.URL + "/mcp",
			HTTPClient: mcpBearer(key), MaxRetries: -1})
		mcpScenario(t, cs, foreign.ID)
	})
	t.Run("stdio", func(t *testing.T) {
		cmd := exec.Command(env.cli, "mcp")
		cmd.Env = append(os.Environ(), "FORKBOX_URL="+env.d.URL, "FORKBOX_API_KEY="+key)
		cmd.Stderr = os.Stderr
		cs := connectMCP(t, &sdk.CommandTransport{Command: cmd})
		mcpScenario(t, cs, foreign.ID)
	})
	t.Run("policy", func(t *testing.T) {
		// The tenant's policy applies to tool calls as to REST calls, and
		// the tool call's record is "denied" as the REST call's is.
		_, pkey, ptc := newTenant(t, env.c, "mcppolicy", client.TenantPolicy{MaxSessions: 1})
		cs := connectMCP(t, &sdk.StreamableClientTransport{Endpoint: env.d.URL + "/mcp",
			HTTPClient: mcpBearer(pkey), MaxRetries: -1})
		var sb struct{ ID string }
		mcpCall(t, cs, "create_sandbox", map[string]any{}, &sb)
		mcpToolError(t, cs, "create_sandbox", map[string]any{}, "concurrency")
		mcpCall(t, cs, "destroy", map[string]any{"sandbox_id": sb.ID}, nil)
		list, err := ptc.Audit(ctxFor(t, time.Minute), client.AuditFilter{Kind: "mcp.tool", Outcome: "denied"})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Records) != 1 || list.Records[0].Detail["tool"] != "create_sandbox" ||
			list.Records[0].Detail["problem"] != "tenant-concurrency-exceeded" {
			t.Errorf("denied mcp.tool records: %+v", list.Records)
		}
	})
	t.Run("bad-key", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
		for _, k := range []string{"", "not-a-key"} {
			req, _ := http.NewRequestWithContext(ctxFor(t, time.Minute), http.MethodPost, env.d.URL+"/mcp", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if k != "" {
				req.Header.Set("Authorization", "Bearer "+k)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("POST /mcp with key %q: status %d, want 401", k, resp.StatusCode)
			}
		}
		c := sdk.NewClient(&sdk.Implementation{Name: "forkbox-e2e", Version: "1"}, nil)
		if cs, err := c.Connect(ctxFor(t, time.Minute), &sdk.StreamableClientTransport{Endpoint: env.d.URL + "/mcp",
			HTTPClient: mcpBearer("not-a-key"), MaxRetries: -1}, nil); err == nil {
			cs.Close()
			t.Error("the SDK's client connected with an invalid key")
		}
	})

	// The HTTP subtest's calls are the tenant's mcp.tool records; the
	// stdio ones are its REST calls' records (exec, file.write ...).
	list, err := tc.Audit(ctxFor(t, time.Minute), client.AuditFilter{Kind: "mcp.tool", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	failed := 0
	for _, r := range list.Records {
		tool, _ := r.Detail["tool"].(string)
		seen[tool]++
		if r.Outcome == "error" {
			failed++
			if e, _ := r.Detail["error"].(string); e == "" {
				t.Errorf("a failed mcp.tool record without its error: %+v", r)
			}
		}
		if tool == "run_command" && r.Session == "" {
			t.Errorf("a run_command record without its sandbox: %+v", r)
		}
	}
	for _, tool := range []string{"create_sandbox", "run_command", "run_code", "write_file", "read_file", "list_files",
		"snapshot", "fork", "pause", "resume", "destroy", "list_sandboxes"} {
		if seen[tool] == 0 {
			t.Errorf("no mcp.tool audit record of %s (records: %v)", tool, seen)
		}
	}
	if failed < 3 {
		t.Errorf("%d failed mcp.tool records, want the bad template, the bad tier and the other tenant's sandbox", failed)
	}
}

// mcpScenario runs the tools through cs; foreign is another tenant's
// sandbox.
func mcpScenario(t *testing.T, cs *sdk.ClientSession, foreign string) {
	lt, err := cs.ListTools(ctxFor(t, time.Minute), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range lt.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil {
			t.Errorf("tool %s without a description or an input schema", tool.Name)
		}
	}
	for _, want := range []string{"create_sandbox", "run_command", "run_code", "read_file", "write_file", "list_files",
		"snapshot", "fork", "pause", "resume", "destroy", "list_sandboxes"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools %v lack %s", names, want)
		}
	}

	// Bad input is a tool error naming the problem, and makes nothing.
	mcpToolError(t, cs, "create_sandbox", map[string]any{"template": "no-such-template"}, "no-such-template")
	mcpToolError(t, cs, "create_sandbox", map[string]any{"tier": "bogus"}, "tier")
	mcpToolError(t, cs, "run_command", map[string]any{"sandbox_id": foreign, "command": "id"}, "not found")

	var sb struct{ ID, State string }
	mcpCall(t, cs, "create_sandbox", map[string]any{"timeout_s": 300}, &sb)
	if sb.ID == "" || sb.State != "running" {
		t.Fatalf("create_sandbox: %+v", sb)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cs.CallTool(ctx, &sdk.CallToolParams{Name: "destroy", Arguments: map[string]any{"sandbox_id": sb.ID}})
	}()
	var ls struct{ Sandboxes []struct{ ID string } }
	mcpCall(t, cs, "list_sandboxes", map[string]any{}, &ls)
	if !slices.ContainsFunc(ls.Sandboxes, func(s struct{ ID string }) bool { return s.ID == sb.ID }) {
		t.Errorf("list_sandboxes %+v lacks %s", ls, sb.ID)
	}
	if slices.ContainsFunc(ls.Sandboxes, func(s struct{ ID string }) bool { return s.ID == foreign }) {
		t.Errorf("list_sandboxes shows another tenant's sandbox")
	}

	var out struct {
		ExitCode       int `json:"exit_code"`
		Stdout, Stderr string
		StdoutCut      int `json:"stdout_cut_bytes"`
	}
	res := mcpCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "command": "echo hi $X; echo oops >&2; pwd; exit 3",
		"cwd": "/tmp", "env": map[string]string{"X": "there"}}, &out)
	if out.ExitCode != 3 || out.Stdout != "hi there\n/tmp\n" || out.Stderr != "oops\n" {
		t.Errorf("run_command: %+v", out)
	}
	if s := mcpText(res); !strings.Contains(s, "exit code 3") || !strings.Contains(s, "hi there") {
		t.Errorf("run_command's text: %q", s)
	}
	res = mcpCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "command": "seq 1 100000", "max_output_bytes": 1000}, &out)
	if out.StdoutCut != 588895-1000 || !strings.HasSuffix(out.Stdout, "99999\n100000\n") || !strings.HasPrefix(out.Stdout, "1\n2\n") {
		t.Errorf("long output: cut %d, %d bytes kept", out.StdoutCut, len(out.Stdout))
	}
	if s := mcpText(res); !strings.Contains(s, "bytes were cut") || !strings.Contains(s, "read_file") {
		t.Errorf("long output's note: %q", s)
	}

	// Files, and the same file as a resource.
	mcpCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/work/notes.txt", "content": "hello mcp\n"}, nil)
	var rd struct {
		Content string
		More    bool
	}
	mcpCall(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/work/notes.txt"}, &rd)
	if rd.Content != "hello mcp\n" || rd.More {
		t.Errorf("read_file: %+v", rd)
	}
	mcpCall(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/work/notes.txt", "offset": 6, "max_bytes": 3}, &rd)
	if rd.Content != "mcp" || !rd.More {
		t.Errorf("read_file in parts: %+v", rd)
	}
	var lf struct{ Entries []struct{ Path, Type string } }
	mcpCall(t, cs, "list_files", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/work"}, &lf)
	if len(lf.Entries) != 1 || lf.Entries[0].Path != "/home/user/work/notes.txt" || lf.Entries[0].Type != "file" {
		t.Errorf("list_files: %+v", lf)
	}
	mcpToolError(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "notes.txt"}, "absolute")
	mcpToolError(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/none"}, "")
	rr, err := cs.ReadResource(ctxFor(t, time.Minute), &sdk.ReadResourceParams{URI: "forkbox://sandbox/" + sb.ID + "/files/home/user/work/notes.txt"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "hello mcp\n" {
		t.Errorf("resource: %+v, %v", rr, err)
	}
	if _, err := cs.ReadResource(ctxFor(t, time.Minute), &sdk.ReadResourceParams{URI: "forkbox://sandbox/" + foreign + "/files/etc/hostname"}); err == nil {
		t.Error("another tenant's file read as a resource")
	}

	// A stateful kernel.
	var code struct {
		Results []struct {
			IsMain bool `json:"is_main_result"`
			Text   string
		}
		Stdout string
		Error  *struct{ Name, Value, Traceback string }
	}
	mcpCall(t, cs, "run_code", map[string]any{"sandbox_id": sb.ID, "code": "x = 41\nprint('set')"}, &code)
	if code.Stdout != "set\n" || code.Error != nil {
		t.Errorf("run_code: %+v %+v", code, code.Error)
	}
	mcpCall(t, cs, "run_code", map[string]any{"sandbox_id": sb.ID, "code": "x + 1"}, &code)
	if len(code.Results) != 1 || !code.Results[0].IsMain || code.Results[0].Text != "42" {
		t.Errorf("run_code kept no state: %+v", code)
	}
	mcpCall(t, cs, "run_code", map[string]any{"sandbox_id": sb.ID, "code": "1/0"}, &code)
	if code.Error == nil || code.Error.Name != "ZeroDivisionError" {
		t.Errorf("run_code's error: %+v", code)
	}

	// Snapshot, and a fork of two whose children see the file.
	var snap struct {
		SnapshotID string `json:"snapshot_id"`
	}
	mcpCall(t, cs, "snapshot", map[string]any{"sandbox_id": sb.ID, "expires_in_s": 600}, &snap)
	if snap.SnapshotID == "" {
		t.Errorf("snapshot: %+v", snap)
	}
	var fk struct{ Children []struct{ ID string } }
	mcpCall(t, cs, "fork", map[string]any{"sandbox_id": sb.ID, "n": 2}, &fk)
	if len(fk.Children) != 2 {
		t.Fatalf("fork: %+v", fk)
	}
	for _, ch := range fk.Children {
		mcpCall(t, cs, "run_command", map[string]any{"sandbox_id": ch.ID, "command": "cat /home/user/work/notes.txt"}, &out)
		if out.Stdout != "hello mcp\n" || out.ExitCode != 0 {
			t.Errorf("child %s: %+v", ch.ID, out)
		}
		mcpCall(t, cs, "destroy", map[string]any{"sandbox_id": ch.ID}, nil)
	}

	mcpCall(t, cs, "pause", map[string]any{"sandbox_id": sb.ID}, &sb)
	if sb.State != "paused" {
		t.Errorf("pause: state %s", sb.State)
	}
	mcpCall(t, cs, "resume", map[string]any{"sandbox_id": sb.ID}, &sb)
	if sb.State != "running" {
		t.Errorf("resume: state %s", sb.State)
	}
	mcpCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "command": "true"}, &out)
	mcpCall(t, cs, "destroy", map[string]any{"sandbox_id": sb.ID}, nil)
	mcpToolError(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "command": "true"}, "")
}

// connectMCP connects the Go SDK's client over tr, closed when t ends.
func connectMCP(t *testing.T, tr sdk.Transport) *sdk.ClientSession {
	t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "forkbox-e2e", Version: "1"}, nil)
	cs, err := c.Connect(ctxFor(t, time.Minute), tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// mcpCall calls tool with args, fails t on any error, and decodes its
// structured output into out (when not nil).
func mcpCall(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any, out any) *sdk.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(ctxFor(t, 2*time.Minute), &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %s", tool, mcpText(res))
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: output %s: %v", tool, b, err)
		}
	}
	return res
}

// mcpToolError calls tool and checks that it answers a tool error (not a
// protocol error) whose text holds want.
func mcpToolError(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any, want string) {
	t.Helper()
	res, err := cs.CallTool(ctxFor(t, time.Minute), &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Errorf("%s %v: a protocol error, want a tool error: %v", tool, args, err)
		return
	}
	if !res.IsError || !strings.Contains(strings.ToLower(mcpText(res)), want) {
		t.Errorf("%s %v: IsError %v, %q; want a tool error saying %q", tool, args, res.IsError, mcpText(res), want)
	}
}

func mcpText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mcpBearer is an HTTP client sending key as bearer token.
func mcpBearer(key string) *http.Client {
	return &http.Client{Transport: bearerTransport{key: key}}
}

type bearerTransport struct{ key string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPTypeScriptSDK runs compat/mcp: the unmodified
// @modelcontextprotocol/sdk client (pinned in its package-lock) against
// `forkbox mcp` over stdio and the daemon's /mcp over streamable HTTP.
func TestMCPTypeScriptSDK(t *testing.T) {
	need(t)
	dir, npm := npmSuite(t, "mcp", "@modelcontextprotocol/sdk")
	_, key, _ := newTenant(t, env.c, "mcpts", client.TenantPolicy{})
	environ := []string{"FORKBOX_URL=" + env.d.URL, "FORKBOX_API_KEY=" + key, "FORKBOX_BIN=" + env.cli}
	var live io.Writer
	if testing.Verbose() {
		live = os.Stdout
	}
	out, err := runNPM(ctxFor(t, 3*time.Minute), dir, npm, environ, live, "test")
	if err != nil {
		t.Fatalf("MCP TypeScript SDK: npm test: %v\n%s", err, out)
	}
	t.Logf("MCP TypeScript SDK: %s", summary(out))
}
