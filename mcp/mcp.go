// Package mcp exposes forkbox as a Model Context Protocol server: tools to
// create sandboxes, run commands and code in them, move files, snapshot,
// fork, pause, resume and destroy them, and a resource template for a
// sandbox's files. It is built on github.com/modelcontextprotocol/go-sdk
// and speaks to forkbox only through the Go client (package client), so a
// tool call is a REST call made with the caller's API key: the tenant's
// policy, its quotas, tenancy (another tenant's sandbox is not found) and
// the audit trail apply as to any other call.
//
// Two transports serve it: standard input and output (ServeStdio, the
// forkbox mcp command) and streamable HTTP on the daemon (NewHTTPHandler,
// mounted at /mcp).
package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/version"
)

// Call is one finished tool call, as Options.OnCall gets it.
type Call struct {
	// Tool is the tool's name ("run_command").
	Tool string
	// Sandbox is the sandbox the call named, if any.
	Sandbox string
	// Err is why the call failed (nil: it succeeded).
	Err error
}

// Options configure a server made by NewServer.
type Options struct {
	// OnCall, when set, is called after every tool call, with the
	// context of the call (the daemon records each as an audit record).
	OnCall func(context.Context, Call)
}

// instructions tell the model what the server is for and how its tools
// fit together.
const instructions = `forkbox runs untrusted code in isolated Linux sandboxes (runc or gVisor).
Start with create_sandbox; its id is the sandbox_id of every other tool. run_command runs a shell
command and returns stdout, stderr and the exit code; run_code runs Python, JavaScript or bash in a
kernel that keeps its state between calls. read_file, write_file and list_files move files (absolute
paths). snapshot saves a sandbox's files; fork starts copies of a running sandbox. pause and resume
freeze and thaw one; destroy ends it (sandboxes also end at their timeout). A sandbox has no network
unless created with network_allow. The files of a sandbox are also resources:
forkbox://sandbox/{id}/files/{path}.`

// NewServer returns an MCP server whose tools call forkbox through c.
func NewServer(c *client.Client, opts Options) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "forkbox", Title: "forkbox sandboxes", Version: version.Version},
		&sdk.ServerOptions{Instructions: instructions, SchemaCache: schemas})
	t := &tools{c: c, onCall: opts.OnCall}
	t.addSessionTools(s)
	t.addExecTools(s)
	t.addFileTools(s)
	addFileResources(s, c)
	return s
}

// ServeStdio serves an MCP server over c on in and out (a command's
// standard input and output: newline-delimited JSON-RPC) until the client
// closes in or ctx ends. Its tool calls are the daemon's REST calls, each
// audited there as any call of c's key.
func ServeStdio(ctx context.Context, c *client.Client, in io.Reader, out io.Writer) error {
	t := &sdk.IOTransport{Reader: io.NopCloser(in), Writer: nopWriteCloser{out}}
	return NewServer(c, Options{}).Run(ctx, t)
}

// nopWriteCloser is a writer whose Close does nothing (the command's
// standard output outlives the session).
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// schemas caches the tools' schemas across the servers of HTTP requests
// (each request gets a server of its own).
var schemas = sdk.NewSchemaCache()

// tools holds what every tool handler uses.
type tools struct {
	c      *client.Client
	onCall func(context.Context, Call)
}

// sandboxNamer is an input naming a sandbox (for Call.Sandbox).
type sandboxNamer interface{ sandbox() string }

// SandboxRef is the input part naming the sandbox a tool acts on.
type SandboxRef struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id, as create_sandbox or list_sandboxes returned it"`
}

func (r SandboxRef) sandbox() string { return r.SandboxID }

// add registers tool name with its description and handler h; the input
// schema is In's (jsonschema tags are the descriptions), with enum
// restricting the named properties. Each call is passed to onCall, and a
// handler's error becomes a tool error (IsError) naming the problem.
func add[In, Out any](t *tools, s *sdk.Server, name, desc string, enums map[string][]any,
	h func(context.Context, In) (*sdk.CallToolResult, Out, error)) {
	tool := &sdk.Tool{Name: name, Description: desc, Annotations: annotations[name]}
	if len(enums) > 0 {
		tool.InputSchema = enumSchema[In](name, enums)
	}
	sdk.AddTool(s, tool, func(ctx context.Context, _ *sdk.CallToolRequest, in In) (*sdk.CallToolResult, Out, error) {
		var sandbox string
		n, named := any(in).(sandboxNamer)
		if named {
			sandbox = n.sandbox()
		}
		var res *sdk.CallToolResult
		var out Out
		var err error
		if named {
			err = needSandbox(sandbox)
		}
		if err == nil {
			res, out, err = h(ctx, in)
		}
		if t.onCall != nil {
			t.onCall(ctx, Call{Tool: name, Sandbox: sandbox, Err: err})
		}
		if err != nil {
			var zero Out
			return nil, zero, errors.New(t.describe(err))
		}
		return res, out, nil
	})
}

// annotations are the tools' hints to clients (which ask before a
// destructive call, say): what only reads, what is destructive, what can
// be repeated to the same end. OpenWorldHint is false for all: a tool acts
// inside forkbox's sandboxes, which reach no further than their allow-list.
var annotations = func() map[string]*sdk.ToolAnnotations {
	no := false
	closed := &no
	read := func(title string) *sdk.ToolAnnotations {
		return &sdk.ToolAnnotations{Title: title, ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: closed}
	}
	act := func(title string, destructive, idempotent bool) *sdk.ToolAnnotations {
		d := destructive
		return &sdk.ToolAnnotations{Title: title, DestructiveHint: &d, IdempotentHint: idempotent, OpenWorldHint: closed}
	}
	return map[string]*sdk.ToolAnnotations{
		"create_sandbox":      act("Create a sandbox", false, false),
		"list_sandboxes":      read("List sandboxes"),
		"run_command":         act("Run a command in a sandbox", true, false),
		"run_code":            act("Run code in a sandbox's kernel", true, false),
		"create_code_context": act("Create a kernel context", false, false),
		"read_file":           read("Read a sandbox's file"),
		"list_files":          read("List a sandbox's directory"),
		"write_file":          act("Write a sandbox's file", true, true),
		"snapshot":            act("Snapshot a sandbox", false, false),
		"fork":                act("Fork a sandbox", false, false),
		"pause":               act("Pause a sandbox", false, true),
		"resume":              act("Resume a sandbox", false, true),
		"destroy":             act("Destroy a sandbox", true, true),
	}
}()

// enumSchemas holds the schemas enumSchema made, by tool name: made once,
// they are the same pointers for every server, which SchemaCache then
// resolves once.
var enumSchemas sync.Map

// enumSchema is In's schema with enum set on the properties enums names
// (a property missing from In is a programming error: it panics).
func enumSchema[In any](name string, enums map[string][]any) *jsonschema.Schema {
	if sc, ok := enumSchemas.Load(name); ok {
		return sc.(*jsonschema.Schema)
	}
	sc, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: schema of %s: %v", name, err))
	}
	for prop, vals := range enums {
		p, ok := sc.Properties[prop]
		if !ok {
			panic(fmt.Sprintf("mcp: %s has no property %s", name, prop))
		}
		p.Enum = vals
	}
	got, _ := enumSchemas.LoadOrStore(name, sc)
	return got.(*jsonschema.Schema)
}

// describe is Describe, saying so when the daemon could not be reached.
func (t *tools) describe(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Sprintf("cannot reach the forkbox daemon at %s (%v): is `forkbox serve` running there, and FORKBOX_URL right?",
			t.c.BaseURL(), op.Err)
	}
	return Describe(err)
}

// Describe is the message of a tool error: for a daemon's problem its
// title, detail and field ("Not found: session x not found"), else the
// error's text.
func Describe(err error) string {
	var ae *client.Error
	if !errors.As(err, &ae) {
		return err.Error()
	}
	msg := ae.Title
	if ae.Detail != "" && ae.Detail != ae.Title {
		if msg != "" {
			msg += ": "
		}
		msg += ae.Detail
	}
	if ae.Field != "" && !strings.Contains(msg, ae.Field) {
		msg += " (field " + ae.Field + ")"
	}
	return fmt.Sprintf("%s (HTTP %d)", msg, ae.Status)
}

// text is a result whose content is s alone (the structured output is
// then only in structuredContent).
func text(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}
