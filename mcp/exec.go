package mcp

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"slices"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/client"
)

// Output bounds of run_command and run_code, in bytes per stream.
const (
	defaultOutputBytes = 16 << 10
	maxOutputBytes     = 1 << 20
	// maxImageBytes bounds a run_code image (decoded) returned as image
	// content; larger ones are only summarized.
	maxImageBytes = 1 << 20
)

// CommandInput is run_command's input.
type CommandInput struct {
	SandboxRef
	Command        string            `json:"command" jsonschema:"shell command line, run with /bin/sh -c (pipes, redirections and && work)"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory (default: the sandbox's; relative paths start at the user's home)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables for this command only"`
	TimeoutS       int64             `json:"timeout_s,omitempty" jsonschema:"kill the command after this many seconds (default 60)"`
	User           string            `json:"user,omitempty" jsonschema:"run as this user (default: the sandbox's user, \"user\"; \"root\" on request)"`
	MaxOutputBytes int               `json:"max_output_bytes,omitempty" jsonschema:"most bytes of stdout and of stderr returned (default 16384, at most 1048576); the middle of longer output is cut"`
}

// CommandOutput is run_command's output.
type CommandOutput struct {
	ExitCode   int    `json:"exit_code" jsonschema:"the exit status; 128+N when signal N killed the command"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	StdoutCut  int    `json:"stdout_cut_bytes,omitempty" jsonschema:"bytes cut from the middle of stdout"`
	StderrCut  int    `json:"stderr_cut_bytes,omitempty" jsonschema:"bytes cut from the middle of stderr"`
	TimedOut   bool   `json:"timed_out,omitempty" jsonschema:"the command was killed at its timeout"`
	OOMKilled  bool   `json:"oom_killed,omitempty" jsonschema:"the kernel's out-of-memory killer ended it"`
	DurationMS int64  `json:"duration_ms"`
}

// CodeInput is run_code's input.
type CodeInput struct {
	SandboxRef
	Code      string `json:"code" jsonschema:"the code to run, like a notebook cell: the value of the last expression is returned as a result"`
	Language  string `json:"language,omitempty" jsonschema:"python (the default), javascript or bash; each language has a default context that keeps its state between calls"`
	ContextID string `json:"context_id,omitempty" jsonschema:"run in this context (from create_code_context) instead of the language's default one; not with language"`
}

// CodeOutput is run_code's output.
type CodeOutput struct {
	Stdout         string       `json:"stdout"`
	Stderr         string       `json:"stderr"`
	Results        []CodeResult `json:"results"`
	Error          *CodeError   `json:"error,omitempty" jsonschema:"set when the code raised an error"`
	ExecutionCount int          `json:"execution_count,omitempty"`
}

// CodeResult is one result of a cell: its text form and a summary of its
// other MIME forms (images are also returned as image content).
type CodeResult struct {
	IsMain  bool     `json:"is_main_result" jsonschema:"the value of the cell's last expression"`
	Text    string   `json:"text,omitempty"`
	Formats []string `json:"formats,omitempty" jsonschema:"the result's other forms, with their sizes (html, png, svg, json, chart ...)"`
}

// CodeError is the error a cell raised.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback,omitempty"`
}

// ContextInput is create_code_context's input.
type ContextInput struct {
	SandboxRef
	Language string `json:"language,omitempty" jsonschema:"python (the default), javascript or bash"`
	Cwd      string `json:"cwd,omitempty" jsonschema:"the context's working directory (must exist)"`
}

// ContextOutput is create_code_context's output.
type ContextOutput struct {
	ContextID string `json:"context_id"`
	Language  string `json:"language"`
	Cwd       string `json:"cwd"`
}

var languages = []any{"python", "javascript", "bash"}

func (t *tools) addExecTools(s *sdk.Server) {
	add(t, s, "run_command", "Run a shell command in a sandbox and wait for it to end; returns its stdout, stderr and exit code. "+
		"Output longer than max_output_bytes is cut in the middle, with a note saying how much; to see all of a long "+
		"output, redirect it to a file (cmd > /tmp/out.txt 2>&1) and read that with read_file in parts, or grep it.",
		nil, t.runCommand)
	add(t, s, "run_code", "Run code in a sandbox's stateful kernel (Jupyter-style: Python by default, also JavaScript and bash). "+
		"Variables, imports and the working directory persist between calls in the same context. Returns stdout, stderr, "+
		"the results (the last expression's value; charts and images too) and the error, if the code raised one.",
		map[string][]any{"language": languages}, t.runCode)
	add(t, s, "create_code_context", "Create a separate kernel context in a sandbox (its own state, language and working "+
		"directory); pass its context_id to run_code.", map[string][]any{"language": languages},
		func(ctx context.Context, in ContextInput) (*sdk.CallToolResult, ContextOutput, error) {
			if err := needSandbox(in.SandboxID); err != nil {
				return nil, ContextOutput{}, err
			}
			cc, err := t.c.CreateCodeContext(ctx, in.SandboxID, client.CodeContextRequest{Language: in.Language, Cwd: in.Cwd})
			if err != nil {
				return nil, ContextOutput{}, err
			}
			return nil, ContextOutput{ContextID: cc.ID, Language: cc.Language, Cwd: cc.Cwd}, nil
		})
}

// runCommand is run_command.
func (t *tools) runCommand(ctx context.Context, in CommandInput) (*sdk.CallToolResult, CommandOutput, error) {
	if strings.TrimSpace(in.Command) == "" {
		return nil, CommandOutput{}, fmt.Errorf("command is empty")
	}
	bound, err := outputBound(in.MaxOutputBytes)
	if err != nil {
		return nil, CommandOutput{}, err
	}
	res, err := t.c.ExecCollect(ctx, in.SandboxID, client.ExecRequest{Cmd: in.Command, Cwd: in.Cwd, Env: in.Env,
		TimeoutS: in.TimeoutS, User: in.User})
	if err != nil {
		return nil, CommandOutput{}, err
	}
	out := CommandOutput{ExitCode: res.ExitCode, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, DurationMS: res.DurationMS}
	var notes []string
	out.Stdout, out.StdoutCut = cut(res.Stdout, bound)
	out.Stderr, out.StderrCut = cut(res.Stderr, bound)
	for _, c := range []struct {
		name      string
		n, cut    int
		truncated bool
	}{{"stdout", len(res.Stdout), out.StdoutCut, res.StdoutTruncated}, {"stderr", len(res.Stderr), out.StderrCut, res.StderrTruncated}} {
		if c.truncated {
			notes = append(notes, fmt.Sprintf("%s was longer than the 16 MiB the daemon keeps.", c.name))
		}
		if c.cut > 0 {
			notes = append(notes, fmt.Sprintf("%s was %d bytes; %d bytes were cut from its middle.", c.name, c.n, c.cut))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "exit code %d", out.ExitCode)
	if out.TimedOut {
		b.WriteString(" (killed at its timeout)")
	}
	if out.OOMKilled {
		b.WriteString(" (killed: out of memory)")
	}
	fmt.Fprintf(&b, "\n--- stdout ---\n%s\n--- stderr ---\n%s", out.Stdout, out.Stderr)
	if len(notes) > 0 {
		fmt.Fprintf(&b, "\n--- note ---\n%s To get all of it, run the command again with its output redirected to a file "+
			"(command > /tmp/out.txt 2>&1) and read the file with read_file (offset, max_bytes) or filter it "+
			"with grep, head or tail in run_command.", strings.Join(notes, " "))
	}
	return text(b.String()), out, nil
}

// runCode is run_code.
func (t *tools) runCode(ctx context.Context, in CodeInput) (*sdk.CallToolResult, CodeOutput, error) {
	if err := needSandbox(in.SandboxID); err != nil {
		return nil, CodeOutput{}, err
	}
	ex, err := t.c.RunCode(ctx, in.SandboxID, client.CodeRequest{Code: in.Code, Language: in.Language, ContextID: in.ContextID}, nil)
	if err != nil {
		return nil, CodeOutput{}, err
	}
	out := CodeOutput{Results: []CodeResult{}, ExecutionCount: ex.ExecutionCount}
	var cutOut, cutErr int
	out.Stdout, cutOut = cut([]byte(ex.Stdout), defaultOutputBytes)
	out.Stderr, cutErr = cut([]byte(ex.Stderr), defaultOutputBytes)
	res := &sdk.CallToolResult{}
	var b strings.Builder
	for _, l := range ex.Lines {
		if l.Type != "result" {
			continue
		}
		r := CodeResult{IsMain: l.IsMainResult}
		r.Text, _ = cut([]byte(l.Text), defaultOutputBytes)
		for _, k := range sortedKeys(l.Data) {
			v, ok := l.Data[k].(string)
			if !ok || k == "type" || k == "text" || k == "is_main_result" {
				continue
			}
			r.Formats = append(r.Formats, fmt.Sprintf("%s (%d bytes)", k, len(v)))
			if mime, isImage := imageMIME[k]; isImage && base64.StdEncoding.DecodedLen(len(v)) <= maxImageBytes {
				if img, err := base64.StdEncoding.DecodeString(v); err == nil {
					res.Content = append(res.Content, &sdk.ImageContent{Data: img, MIMEType: mime})
				}
			}
		}
		fmt.Fprintf(&b, "--- result%s ---\n%s\n", map[bool]string{true: " (main)", false: ""}[r.IsMain], r.Text)
		if len(r.Formats) > 0 {
			fmt.Fprintf(&b, "(also as: %s)\n", strings.Join(r.Formats, ", "))
		}
		out.Results = append(out.Results, r)
	}
	if ex.Error != nil {
		out.Error = &CodeError{Name: ex.Error.Name, Value: ex.Error.Value, Traceback: ex.Error.Traceback}
		fmt.Fprintf(&b, "--- error ---\n%s: %s\n%s\n", ex.Error.Name, ex.Error.Value, ex.Error.Traceback)
	}
	fmt.Fprintf(&b, "--- stdout ---\n%s\n--- stderr ---\n%s", out.Stdout, out.Stderr)
	if cutOut > 0 || cutErr > 0 || ex.Dropped > 0 {
		fmt.Fprintf(&b, "\n--- note ---\n%d bytes of stdout and %d of stderr were cut from their middle", cutOut, cutErr)
		if ex.Dropped > 0 {
			fmt.Fprintf(&b, ", and %d more bytes of output past the first %d MiB were not kept", ex.Dropped, client.MaxCodeKept>>20)
		}
		b.WriteString("; write long output to a file and read it with read_file.")
	}
	res.Content = append([]sdk.Content{&sdk.TextContent{Text: b.String()}}, res.Content...)
	return res, out, nil
}

// imageMIME maps the result formats returned as image content to their
// MIME types.
var imageMIME = map[string]string{"png": "image/png", "jpeg": "image/jpeg"}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// outputBound is the per-stream bound asked for (0: the default), or an
// error naming max_output_bytes when it is out of range.
func outputBound(n int) (int, error) {
	switch {
	case n == 0:
		return defaultOutputBytes, nil
	case n < 0 || n > maxOutputBytes:
		return 0, fmt.Errorf("max_output_bytes must be between 1 and %d", maxOutputBytes)
	}
	return n, nil
}

// cut returns b as text (invalid UTF-8 replaced) of at most about bound
// bytes: the first quarter and the last three quarters of the bound
// around a marker, when b is longer; n is how many bytes were cut.
func cut(b []byte, bound int) (s string, n int) {
	if len(b) <= bound {
		return strings.ToValidUTF8(string(b), "\uFFFD"), 0
	}
	head, tail := bound/4, bound-bound/4
	n = len(b) - head - tail
	return strings.ToValidUTF8(string(b[:head]), "\uFFFD") +
		fmt.Sprintf("\n[... %d bytes cut ...]\n", n) +
		strings.ToValidUTF8(string(b[len(b)-tail:]), "\uFFFD"), n
}

// needSandbox refuses, before any call, a sandbox id that is empty or
// could not be one path segment as it is (the client's code methods put
// the id into their paths unescaped).
func needSandbox(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("sandbox_id is required: a sandbox's id, as create_sandbox or list_sandboxes returned it")
	case id == "." || id == ".." || url.PathEscape(id) != id:
		return fmt.Errorf("sandbox_id %q is not a sandbox id", id)
	}
	return nil
}
