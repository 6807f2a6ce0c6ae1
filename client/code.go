package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	v1 "github.com/forkbox/forkbox/api/v1"
)

// The code-execution service's wire types (api/v1/code.go).
type (
	CodeRequest        = v1.CodeRequest
	CodeLine           = v1.CodeLine
	CodeContext        = v1.CodeContext
	CodeContextRequest = v1.CodeContextRequest
)

// Execution is what a cell gave: its result, error and count lines in
// order (Lines; stdout and stderr are in Stdout and Stderr, whole), the
// main result's text and the error line (nil: none).
type Execution struct {
	Lines          []CodeLine
	Stdout, Stderr string
	Text           string
	Error          *CodeLine
	ExecutionCount int
	// Dropped counts the bytes RunCode did not keep: stdout or stderr
	// past MaxCodeKept each, and result lines once MaxCodeKept bytes of
	// them were kept (onLine still saw them all).
	Dropped int64
}

// MaxCodeKept bounds, in bytes, each of what RunCode keeps of a cell:
// its stdout, its stderr, and its other lines (results, say) together. A
// cell printing without end must not grow the caller without end (the
// daemon's MCP tools run RunCode in the daemon).
const MaxCodeKept = 16 << 20

// maxCodeLine bounds one line of an execute stream, in bytes.
const maxCodeLine = 32 << 20

// RunCode runs req in session id's code-execution service and returns the
// execution once the cell ended. onLine, when not nil, gets each line as
// it arrives (stdout while the cell still runs, say). Ending ctx
// interrupts the cell. A cell that fails is not an error: its error line
// is Execution.Error.
func (c *Client) RunCode(ctx context.Context, id string, req CodeRequest, onLine func(CodeLine)) (*Execution, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/sessions/" + id + "/code/execute",
		body: strings.NewReader(string(b)), size: int64(len(b)), contentType: "application/json"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	ex := &Execution{}
	var stdout, stderr strings.Builder
	var linesKept int64
	keep := func(b *strings.Builder, text string) {
		if room := MaxCodeKept - b.Len(); room < len(text) {
			ex.Dropped += int64(len(text) - max(room, 0))
			text = text[:max(room, 0)]
		}
		b.WriteString(text)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxCodeLine)
	for sc.Scan() {
		var l CodeLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("code stream: bad line: %w", err)
		}
		_ = json.Unmarshal(sc.Bytes(), &l.Data)
		if onLine != nil && l.Type != "keepalive" && l.Type != "end_of_execution" {
			onLine(l)
		}
		switch l.Type {
		case "end_of_execution":
			ex.Stdout, ex.Stderr = stdout.String(), stderr.String()
			return ex, nil
		case "keepalive":
			continue
		case "stdout":
			keep(&stdout, l.Text)
			continue
		case "stderr":
			keep(&stderr, l.Text)
			continue
		case "result":
			if l.IsMainResult {
				ex.Text = l.Text
			}
		case "error":
			e := l
			ex.Error = &e
		case "number_of_executions":
			ex.ExecutionCount = l.ExecutionCount
		}
		if n := int64(len(sc.Bytes())); linesKept+n > MaxCodeKept {
			ex.Dropped += n
			continue
		}
		linesKept += int64(len(sc.Bytes()))
		ex.Lines = append(ex.Lines, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("code stream: %w", err)
	}
	return nil, errors.New("code stream ended before end_of_execution")
}

// CreateCodeContext makes a context in session id's code-execution service
// and starts its interpreter.
func (c *Client) CreateCodeContext(ctx context.Context, id string, req CodeContextRequest) (*CodeContext, error) {
	var out CodeContext
	if _, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+id+"/code/contexts", nil, nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CodeContexts lists session id's contexts.
func (c *Client) CodeContexts(ctx context.Context, id string) ([]CodeContext, error) {
	var out []CodeContext
	if _, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+id+"/code/contexts", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// RestartCodeContext gives context cid a new interpreter (its state is
// gone).
func (c *Client) RestartCodeContext(ctx context.Context, id, cid string) error {
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+id+"/code/contexts/"+url.PathEscape(cid)+"/restart", nil, nil, nil, nil)
	return err
}

// DeleteCodeContext ends context cid and its interpreter.
func (c *Client) DeleteCodeContext(ctx context.Context, id, cid string) error {
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/sessions/"+id+"/code/contexts/"+url.PathEscape(cid), nil, nil, nil, nil)
	return err
}
