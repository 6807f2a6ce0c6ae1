package client

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	v1 "github.com/forkbox/forkbox/api/v1"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Exec runs req and streams its output into stdout and stderr (either may
// be nil) as it arrives; it returns when the command ends.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	req.Background = false
	return c.stream(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/exec", req, stdout, stderr, nil)
}

// ExecCollect runs req and returns its output in one result (at most 16
// MiB of each stream).
func (c *Client) ExecCollect(ctx context.Context, id string, req ExecRequest) (*ExecOutput, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	req.Background = false
	out := &ExecOutput{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/exec", nil, nil, req, out)
	return out, err
}

// ExecBackground starts req and returns its pid at once.
func (c *Client) ExecBackground(ctx context.Context, id string, req ExecRequest) (int, error) {
	if err := checkID("session", id); err != nil {
		return 0, err
	}
	req.Background = true
	var out v1.BackgroundStarted
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/exec", nil, nil, req, &out)
	return out.Pid, err
}

// Processes lists the session's running commands.
func (c *Client) Processes(ctx context.Context, id string) ([]Process, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	var out v1.ProcessList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/processes", nil, nil, nil, &out)
	return out.Processes, err
}

// Attach re-attaches to command pid: its output from now on, then its result.
func (c *Client) Attach(ctx context.Context, id string, pid int, stdout, stderr io.Writer) (*ExecResult, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	path := "/v1/sessions/" + url.PathEscape(id) + "/processes/" + strconv.Itoa(pid) + "/stream"
	return c.stream(ctx, http.MethodGet, path, nil, stdout, stderr, nil)
}

// Kill kills command pid's process group.
func (c *Client) Kill(ctx context.Context, id string, pid int) error {
	if err := checkID("session", id); err != nil {
		return err
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(id)+"/processes/"+strconv.Itoa(pid), nil, nil, nil, nil)
	return err
}

// Signal sends 9 (SIGKILL) or 15 (SIGTERM) to command pid's process group.
func (c *Client) Signal(ctx context.Context, id string, pid, signal int) error {
	if err := checkID("session", id); err != nil {
		return err
	}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/processes/"+strconv.Itoa(pid)+"/signal",
		nil, nil, v1.Signal{Signal: signal}, nil)
	return err
}

// SendStdin writes data to command pid's stdin (started with KeepStdin),
// closing it afterwards when close is set.
func (c *Client) SendStdin(ctx context.Context, id string, pid int, data []byte, close bool) error {
	if err := checkID("session", id); err != nil {
		return err
	}
	body := v1.StdinRequest{Data: data, Close: close}
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
