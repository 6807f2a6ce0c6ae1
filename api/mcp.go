package api

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/mcp"
)

// mcpHandler is the MCP endpoint (/mcp, streamable HTTP; package mcp),
// behind the same API-key check as every route: its tools call the REST
// API through s itself in the process, with the caller's key, so policy,
// tenancy and the REST calls' audit records are those of any call; every
// tool call is also an audit record of its own (recordTool).
func (s *Server) mcpHandler() http.Handler {
	return s.authenticated(mcp.NewHTTPHandler(s, s.recordTool), false)
}

// recordTool writes the audit record of one MCP tool call: kind
// "mcp.tool", the tool's name and, for a failure, its message in the
// detail (with the problem type of a daemon's refusal); the sandbox it
// named as the record's session. A call the tenant's policy refused is
// "denied", as its REST call's record is (access.IsDenial).
func (s *Server) recordTool(ctx context.Context, c mcp.Call) {
	ev := audit.Event{Kind: "mcp.tool", Session: c.Sandbox, Outcome: audit.OK, Detail: map[string]any{"tool": c.Tool}}
	if c.Err != nil {
		ev.Outcome = audit.Error
		var ae *client.Error
		if errors.As(c.Err, &ae) {
			slug := strings.TrimPrefix(ae.Type, problemPath)
			if access.IsDenial(slug, ae.Status) {
				ev.Outcome = audit.Denied
			}
			ev.Detail["problem"] = slug
		}
		ev.Detail["error"], _ = s.hide.Redact(mcp.Describe(c.Err))
	}
	_ = s.audit.Record(ctx, ev)
}
