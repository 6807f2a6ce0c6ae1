package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/node"
)

// Stage streams r into the agent (POST /stage), which holds it in the
// sandbox's memory (charged to the sandbox) until a request names it
// (StartOpts.Script or StdinStage, WriteStaged) or it expires. Errors: r's
// own error as it is; a sandbox without room for it is ErrResourceExhausted
// and any other answer but 200 ErrUnavailable (as *Error, Refused); a
// failure to reach the agent is classified with ctx (Classify).
func (c *Client) Stage(ctx context.Context, r io.Reader) (node.Staged, error) {
	// The transport reads r in its own goroutine.
	var errMu sync.Mutex
	var readErr error
	body := readerFunc(func(b []byte) (int, error) {
		n, err := r.Read(b)
		if err != nil && !errors.Is(err, io.EOF) {
			errMu.Lock()
			readErr = err
			errMu.Unlock()
		}
		return n, err
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, BaseURL+"/stage", body)
	if err != nil {
		return node.Staged{}, err
	}
	resp, err := c.http.Do(req)
	errMu.Lock()
	rerr := readErr
	errMu.Unlock()
	if rerr != nil {
		if err == nil {
			resp.Body.Close()
		}
		return node.Staged{}, rerr
	}
	if err != nil {
		return node.Staged{}, Classify(ctx, err, "")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		if resp.StatusCode == http.StatusInsufficientStorage || resp.StatusCode == http.StatusTooManyRequests {
			return node.Staged{}, &Error{Kind: Refused, Err: fmt.Errorf("cannot hold the input (larger inputs wait in the sandbox's memory until the command starts): %s: %w",
				e.Message, errdefs.ErrResourceExhausted)}
		}
		return node.Staged{}, &Error{Kind: Refused, Err: fmt.Errorf("agent: staging an input: HTTP %d: %s: %w", resp.StatusCode, e.Message, errdefs.ErrUnavailable)}
	}
	var reply wire.StageReply
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&reply); err != nil || reply.ID == "" {
		return node.Staged{}, &Error{Kind: Refused, Err: fmt.Errorf("agent: bad stage reply (%v): %w", err, errdefs.ErrUnavailable)}
	}
	return node.Staged{ID: reply.ID, Size: reply.Size}, nil
}

// Unstage drops staged input id the agent still holds (DELETE
// /stage/ID). It is best effort (a staged input expires by itself): the
// error says only whether the request went out.
func (c *Client) Unstage(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, BaseURL+"/stage/"+id, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Init gives the running agent new sandbox-wide defaults (POST /init):
// the environment, the default user and the default working directory
// (a restored agent has its snapshot's). An answer but 204 is an error.
func (c *Client) Init(ctx context.Context, r wire.InitRequest) error {
	body, _ := json.Marshal(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, BaseURL+"/init", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("agent init: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("agent init: HTTP %d", resp.StatusCode)
	}
	return nil
}

// WarmCode waits until the agent's code-execution service has its default
// Python kernel ready (POST /code/warm), starting it if need be. An answer
// but 204 is an error (the body says why).
func (c *Client) WarmCode(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, BaseURL+"/code/warm", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("agent: warm the code interpreter: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("agent: warm the code interpreter: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	return nil
}

// PrepareCheckpoint asks the agent to get ready for a memory checkpoint
// of generation gen (POST /snapshot/prepare): it closes every connection
// (open streams end), unlinks its socket and waits for the host's resume
// file of that generation. Errors are ErrUnavailable.
func (c *Client) PrepareCheckpoint(ctx context.Context, gen uint64) error {
	body, _ := json.Marshal(wire.PrepareRequest{Generation: gen})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, BaseURL+"/snapshot/prepare", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("prepare agent for a checkpoint: %w: %v", errdefs.ErrUnavailable, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("prepare agent for a checkpoint: %w: HTTP %d", errdefs.ErrUnavailable, resp.StatusCode)
	}
	return nil
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
