package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/envdpb/filesystempb"
	"github.com/forkbox/forkbox/node"
)

// The file calls act as user (a name or number the sandbox knows) inside
// the sandbox's own mount namespace: relative paths start at the user's
// home, and ".." and symlinks resolve inside the sandbox. Their errors are
// the agent's, unclassified (Classify), except Upload's and Download's
// answers, which come classified.

// Stat describes path.
func (c *Client) Stat(ctx context.Context, path, user string) (node.Entry, error) {
	req := connect.NewRequest(&filesystempb.StatRequest{Path: path})
	setUser(req.Header(), user)
	resp, err := c.fs.Stat(ctx, req)
	if err != nil {
		return node.Entry{}, err
	}
	return entryOf(resp.Msg.GetEntry()), nil
}

// ListDir lists directory path down to depth levels (1 = its entries).
func (c *Client) ListDir(ctx context.Context, path, user string, depth int) ([]node.Entry, error) {
	req := connect.NewRequest(&filesystempb.ListDirRequest{Path: path, Depth: uint32(depth)})
	setUser(req.Header(), user)
	resp, err := c.fs.ListDir(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make([]node.Entry, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		out = append(out, entryOf(e))
	}
	return out, nil
}

// MakeDir creates directory path and its parents, owned by user
// (already_exists when it exists).
func (c *Client) MakeDir(ctx context.Context, path, user string) (node.Entry, error) {
	req := connect.NewRequest(&filesystempb.MakeDirRequest{Path: path})
	setUser(req.Header(), user)
	resp, err := c.fs.MakeDir(ctx, req)
	if err != nil {
		return node.Entry{}, err
	}
	return entryOf(resp.Msg.GetEntry()), nil
}

// Move renames source to destination (creating destination's parents).
func (c *Client) Move(ctx context.Context, source, destination, user string) (node.Entry, error) {
	req := connect.NewRequest(&filesystempb.MoveRequest{Source: source, Destination: destination})
	setUser(req.Header(), user)
	resp, err := c.fs.Move(ctx, req)
	if err != nil {
		return node.Entry{}, err
	}
	return entryOf(resp.Msg.GetEntry()), nil
}

// Remove deletes path (a directory with everything in it).
func (c *Client) Remove(ctx context.Context, path, user string) error {
	req := connect.NewRequest(&filesystempb.RemoveRequest{Path: path})
	setUser(req.Header(), user)
	_, err := c.fs.Remove(ctx, req)
	return err
}

// entryOf converts envd's entry: Type is "file", "dir" or "symlink", Mode
// the permission bits (with setuid, setgid and sticky).
func entryOf(e *filesystempb.EntryInfo) node.Entry {
	t := "file"
	switch e.GetType() {
	case filesystempb.FileType_FILE_TYPE_DIRECTORY:
		t = "dir"
	case filesystempb.FileType_FILE_TYPE_SYMLINK:
		t = "symlink"
	}
	return node.Entry{
		Name: e.GetName(), Path: e.GetPath(), Type: t, Size: e.GetSize(), Mode: e.GetMode() & 0o7777,
		Permissions: e.GetPermissions(), Owner: e.GetOwner(), Group: e.GetGroup(),
		ModifiedAt: e.GetModifiedTime().AsTime(), SymlinkTarget: e.GetSymlinkTarget(),
	}
}

// Upload streams body into path (POST /files: created with its parent
// directories, replaced atomically if it exists, owned by user) and
// returns the path the agent wrote (absolute). size is body's length in
// bytes or -1 when unknown. The agent's refusals come as *Error (see
// filesError); a transport failure is unclassified.
func (c *Client) Upload(ctx context.Context, path, user string, body io.Reader, size int64) (string, error) {
	q := url.Values{"path": {path}, "username": {user}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, BaseURL+"/files?"+q.Encode(), body)
	if err != nil {
		return "", err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", filesError(resp)
	}
	var written []struct {
		Path string `json:"path"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&written); err != nil || len(written) == 0 {
		return "", &Error{Kind: Refused, Err: fmt.Errorf("agent upload reply: %v: %w", err, errdefs.ErrInternal)}
	}
	return written[0].Path, nil
}

// Download opens path for reading (GET /files); size is its length in
// bytes, -1 when the agent streams a file it cannot size. The caller
// closes rc. Errors as for Upload.
func (c *Client) Download(ctx context.Context, path, user string) (rc io.ReadCloser, size int64, err error) {
	q := url.Values{"path": {path}, "username": {user}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, BaseURL+"/files?"+q.Encode(), nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, 0, filesError(resp)
	}
	return resp.Body, resp.ContentLength, nil
}

// filesError maps the agent's /files JSON error ({code, message}): 400
// (field "path") and 401 (field "user") are field errors, 404, 403 and 507
// ErrNotFound, ErrPermissionDenied and ErrInsufficientStorage (Refused);
// 502-504 are ErrUnavailable and any other status (the agent's 500)
// node.ProblemAgentFailed (both Failed).
func filesError(resp *http.Response) error {
	var body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body)
	msg := body.Message
	if msg == "" {
		msg = resp.Status
	}
	refused := func(e error) error { return &Error{Kind: Refused, Err: e} }
	switch resp.StatusCode {
	case http.StatusBadRequest:
		return refused(errdefs.InvalidField("path", "%s", msg))
	case http.StatusUnauthorized:
		return refused(errdefs.InvalidField("user", "%s", msg))
	case http.StatusNotFound:
		return refused(fmt.Errorf("%s: %w", msg, errdefs.ErrNotFound))
	case http.StatusForbidden:
		return refused(fmt.Errorf("%s: %w", msg, errdefs.ErrPermissionDenied))
	case http.StatusInsufficientStorage:
		return refused(fmt.Errorf("%s: %w", msg, errdefs.ErrInsufficientStorage))
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return &Error{Kind: Failed, Err: fmt.Errorf("agent files: %s: %w", msg, errdefs.ErrUnavailable)}
	}
	// The agent answered and failed (a 500): the same call fails again.
	return &Error{Kind: Failed, Err: AgentFailed(msg)}
}
