package client

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// ExecRequest runs a command; set exactly one of Argv and Cmd (a shell
// line run by /bin/sh -c).
type ExecRequest struct {
	Argv       []string          `json:"argv,omitempty"`
	Cmd        string            `json:"cmd,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	User       string            `json:"user,omitempty"`
	TimeoutS   int64             `json:"timeout_s,omitempty"`
	Stdin      []byte            `json:"stdin,omitempty"`
	KeepStdin  bool              `json:"keep_stdin,omitempty"`
	Background bool              `json:"background,omitempty"`
	Tag        string            `json:"tag,omitempty"`
}

// ExecResult is how a command ended; ExitCode is 128+Signal after a
// signal death.
type ExecResult struct {
	Pid        int   `json:"pid"`
	ExitCode   int   `json:"exit_code"`
	Signal     int   `json:"signal,omitempty"`
	TimedOut   bool  `json:"timed_out"`
	OOMKilled  bool  `json:"oom_killed"`
	DurationMS int64 `json:"duration_ms"`
}

// Exec runs req and streams its output into stdout and stderr (either may
// be nil) as it arrives; it returns when the command ends.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	req.Background = false
	return c.stream(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/exec", req, stdout, stderr, nil)
}

// ExecOutput is a finished command with its collected output.
type ExecOutput struct {
	ExecResult
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
}

// ExecCollect runs req and returns its output in one result (at most 16
// MiB of each stream).
func (c *Client) ExecCollect(ctx context.Context, id string, req ExecRequest) (*ExecOutput, error) {
	req.Background = false
	out := &ExecOutput{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/exec", nil, nil, req, out)
	return out, err
}

// ExecBackground starts req and returns its pid at once.
func (c *Client) ExecBackground(ctx context.Context, id string, req ExecRequest) (int, error) {
	req.Background = true
	var out struct {
		Pid int `json:"pid"`
	}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/exec", nil, nil, req, &out)
	return out.Pid, err
}

// Process is a running command.
type Process struct {
	Pid  int               `json:"pid"`
	Tag  string            `json:"tag,omitempty"`
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
}

// Processes lists the session's running commands.
func (c *Client) Processes(ctx context.Context, id string) ([]Process, error) {
	var out struct {
		Processes []Process `json:"processes"`
	}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/processes", nil, nil, nil, &out)
	return out.Processes, err
}

// Attach re-attaches to command pid: its output from now on, then its result.
func (c *Client) Attach(ctx context.Context, id string, pid int, stdout, stderr io.Writer) (*ExecResult, error) {
	path := "/v1/sessions/" + url.PathEscape(id) + "/processes/" + strconv.Itoa(pid) + "/stream"
	return c.stream(ctx, http.MethodGet, path, nil, stdout, stderr, nil)
}

// Kill kills command pid's process group.
func (c *Client) Kill(ctx context.Context, id string, pid int) error {
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(id)+"/processes/"+strconv.Itoa(pid), nil, nil, nil, nil)
	return err
}

// Signal sends 9 (SIGKILL) or 15 (SIGTERM) to command pid's process group.
func (c *Client) Signal(ctx context.Context, id string, pid, signal int) error {
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/processes/"+strconv.Itoa(pid)+"/signal",
		nil, nil, map[string]int{"signal": signal}, nil)
	return err
}

// SendStdin writes data to command pid's stdin (started with KeepStdin),
// closing it afterwards when close is set.
func (c *Client) SendStdin(ctx context.Context, id string, pid int, data []byte, close bool) error {
	body := struct {
		Data  []byte `json:"data"`
		Close bool   `json:"close"`
	}{data, close}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/processes/"+strconv.Itoa(pid)+"/stdin",
		nil, nil, body, nil)
	return err
}

// stream sends a request whose reply is the exec event stream and copies
// output into stdout/stderr; started, when set, gets the pid first.
func (c *Client) stream(ctx context.Context, method, path string, in any, stdout, stderr io.Writer, started func(int)) (*ExecResult, error) {
	req := request{method: method, path: path, accept: "text/event-stream"}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		req.body, req.size, req.contentType = strings.NewReader(string(b)), int64(len(b)), "application/json"
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var result *ExecResult
	err = readEvents(resp.Body, func(event, data string) error {
		switch event {
		case "start":
			var s struct {
				Pid int `json:"pid"`
			}
			if err := json.Unmarshal([]byte(data), &s); err != nil {
				return err
			}
			if started != nil {
				started(s.Pid)
			}
		case "stdout", "stderr":
			w := stdout
			if event == "stderr" {
				w = stderr
			}
			b, err := base64.StdEncoding.DecodeString(data)
			if err != nil {
				return fmt.Errorf("bad %s event: %w", event, err)
			}
			if w != nil {
				if _, err := w.Write(b); err != nil {
					return err
				}
			}
		case "exit":
			result = &ExecResult{}
			return json.Unmarshal([]byte(data), result)
		case "error":
			e := &Error{}
			if err := json.Unmarshal([]byte(data), e); err != nil {
				return fmt.Errorf("exec failed: %s", data)
			}
			return e
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if result == nil {
		return nil, fmt.Errorf("exec stream ended without a result")
	}
	return result, nil
}

// readEvents parses a server-sent event stream, calling fn per event.
func readEvents(r io.Reader, fn func(event, data string) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var event string
	var data strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if event != "" || data.Len() > 0 {
				if err := fn(event, data.String()); err != nil {
					return err
				}
			}
			event = ""
			data.Reset()
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(line[len("data:"):], " "))
		}
	}
}
