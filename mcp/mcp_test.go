package mcp

import (
	"context"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/client"
)

// connect serves NewServer over c in memory and returns a client session.
func connect(t *testing.T, c *client.Client, onCall func(context.Context, Call)) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, ct := sdk.NewInMemoryTransports()
	ss, err := NewServer(c, Options{OnCall: onCall}).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestToolsDescribeThemselves: every tool has a description and an
// object schema; the tools on one sandbox require sandbox_id; the
// enumerations are in the schema.
func TestToolsDescribeThemselves(t *testing.T) {
	cs := connect(t, client.New("http://127.0.0.1:1", "k", nil), nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) != 13 {
		t.Errorf("%d tools, want 13", len(res.Tools))
	}
	for _, tool := range res.Tools {
		sc, _ := tool.InputSchema.(map[string]any)
		if len(tool.Description) < 40 || sc["type"] != "object" {
			t.Errorf("%s: description %q, schema %v", tool.Name, tool.Description, sc)
		}
		props, _ := sc["properties"].(map[string]any)
		if _, ok := props["sandbox_id"]; ok {
			req, _ := sc["required"].([]any)
			if !contains(req, "sandbox_id") {
				t.Errorf("%s: sandbox_id is not required (%v)", tool.Name, req)
			}
		}
		if a := tool.Annotations; a == nil || a.Title == "" {
			t.Errorf("%s: no annotations", tool.Name)
		} else if ro := strings.HasPrefix(tool.Name, "read_") || strings.HasPrefix(tool.Name, "list_"); a.ReadOnlyHint != ro {
			t.Errorf("%s: read-only hint %v", tool.Name, a.ReadOnlyHint)
		} else if tool.Name == "destroy" && (a.DestructiveHint == nil || !*a.DestructiveHint) {
			t.Errorf("destroy is not marked destructive")
		}
		if tool.Name == "create_sandbox" {
			tier, _ := props["tier"].(map[string]any)
			if e, _ := tier["enum"].([]any); len(e) != 2 {
				t.Errorf("create_sandbox's tier has no enum: %v", tier)
			}
		}
	}
}

func contains(vs []any, s string) bool {
	for _, v := range vs {
		if v == s {
			return true
		}
	}
	return false
}

// TestToolErrors: bad input and an unreachable daemon are tool errors
// (IsError, a message naming the problem), each passed to OnCall.
func TestToolErrors(t *testing.T) {
	var calls []Call
	cs := connect(t, client.New("http://127.0.0.1:1", "k", nil), func(_ context.Context, c Call) { calls = append(calls, c) })
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"create_sandbox", map[string]any{"tier": "bogus"}, "tier"},
		{"run_command", map[string]any{"sandbox_id": "a/b", "command": "id"}, "not a sandbox id"},
		{"run_command", map[string]any{"sandbox_id": "abc", "command": " "}, "command is empty"},
		{"run_command", map[string]any{"sandbox_id": "abc", "command": "id", "max_output_bytes": -1}, "max_output_bytes"},
		{"read_file", map[string]any{"sandbox_id": "abc", "path": "rel.txt"}, "not absolute"},
		{"write_file", map[string]any{"sandbox_id": "abc", "path": "/x", "content": "!!", "encoding": "base64"}, "base64"},
		{"fork", map[string]any{"sandbox_id": "abc", "n": 0}, "at least 1"},
		{"run_code", map[string]any{"sandbox_id": "abc", "code": "1"}, "cannot reach the forkbox daemon at http://127.0.0.1:1"},
	} {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tc.tool, Arguments: tc.args})
		if err != nil {
			t.Errorf("%s %v: protocol error %v, want a tool error", tc.tool, tc.args, err)
			continue
		}
		text := ""
		if len(res.Content) > 0 {
			text = res.Content[0].(*sdk.TextContent).Text
		}
		if !res.IsError || !strings.Contains(text, tc.want) {
			t.Errorf("%s %v: IsError %v %q, want a tool error saying %q", tc.tool, tc.args, res.IsError, text, tc.want)
		}
	}
	// Schema refusals (the bad tier) happen before the handler: not a call.
	if len(calls) != 7 || calls[0].Tool != "run_command" || calls[0].Err == nil || calls[2].Sandbox != "abc" {
		t.Errorf("calls %+v", calls)
	}
}

// TestCut keeps a quarter of the bound from the start, the rest from the
// end, and says how much went.
func TestCut(t *testing.T) {
	if s, n := cut([]byte("short"), 10); s != "short" || n != 0 {
		t.Errorf("%q %d", s, n)
	}
	b := []byte(strings.Repeat("a", 100) + strings.Repeat("z", 100))
	s, n := cut(b, 40)
	if n != 160 || !strings.HasPrefix(s, "aaaaaaaaaa\n[... 160 bytes cut ...]\n") || !strings.HasSuffix(s, strings.Repeat("z", 30)) {
		t.Errorf("%q %d", s, n)
	}
	if s, _ := cut([]byte("\xff\xfe"), 10); s != "\uFFFD" {
		t.Errorf("invalid UTF-8: %q", s)
	}
}
