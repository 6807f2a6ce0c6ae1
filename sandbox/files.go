package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/envdpb/filesystempb"
	"github.com/forkbox/forkbox/node"
)

func entryFromPB(e *filesystempb.EntryInfo) node.Entry {
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

// checkPath rejects paths no file can have, and paths that are not UTF-8:
// the envd protocol carries paths as protobuf strings, which must be UTF-8
// (only a download, over plain HTTP, can name such a file).
func checkPath(field, p string) error {
	if err := checkPathBytes(field, p); err != nil {
		return err
	}
	if !utf8.ValidString(p) {
		return errdefs.InvalidField(field, "is not valid UTF-8")
	}
	return nil
}

// checkPathBytes rejects paths no file can have.
func checkPathBytes(field, p string) error {
	if p == "" {
		return errdefs.InvalidField(field, "is empty")
	}
	if strings.ContainsRune(p, 0) {
		return errdefs.InvalidField(field, "contains a NUL byte")
	}
	if len(p) > 4096 {
		return errdefs.InvalidField(field, "longer than 4096 bytes")
	}
	return nil
}

// fileCall prepares an agent filesystem call for session id as user; the
// caller runs release when the call is over.
func (m *Manager) fileCall(ctx context.Context, id, user string) (sb *Sandbox, _ string, release func(), err error) {
	sb, release, err = m.use(ctx, id)
	if err != nil {
		return nil, "", nil, err
	}
	if user == "" {
		user = sb.Record().DefaultUser
	}
	if err := ValidateUser("user", user); err != nil {
		release()
		return nil, "", nil, err
	}
	return sb, user, release, nil
}

// Upload streams body into path (created with its parent directories,
// replaced atomically if it exists, owned by user). size is the body's
// length in bytes or -1 when unknown. ErrInsufficientStorage when the
// sandbox's disk is full.
func (m *Manager) Upload(ctx context.Context, id, path, user string, body io.Reader, size int64) (*node.Entry, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	sb, user, release, err := m.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	q := url.Values{"path": {path}, "username": {user}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, agentBaseURL+"/files?"+q.Encode(), body)
	if err != nil {
		return nil, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := sb.agent.http.Do(req)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, m.filesHTTPError(ctx, id, resp)
	}
	var written []struct {
		Path string `json:"path"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&written); err != nil || len(written) == 0 {
		return nil, fmt.Errorf("agent upload reply: %v: %w", err, errdefs.ErrInternal)
	}
	return m.Stat(ctx, id, written[0].Path, user)
}

// Download opens path for reading. The caller closes the reader; size is
// the file's length in bytes.
func (m *Manager) Download(ctx context.Context, id, path, user string) (rc io.ReadCloser, size int64, err error) {
	if err := checkPathBytes("path", path); err != nil {
		return nil, 0, err
	}
	sb, user, release, err := m.fileCall(ctx, id, user)
	if err != nil {
		return nil, 0, err
	}
	q := url.Values{"path": {path}, "username": {user}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, agentBaseURL+"/files?"+q.Encode(), nil)
	if err != nil {
		release()
		return nil, 0, err
	}
	resp, err := sb.agent.http.Do(req)
	if err != nil {
		release()
		return nil, 0, m.agentError(ctx, id, err, "")
	}
	if resp.StatusCode != http.StatusOK {
		defer release()
		defer resp.Body.Close()
		return nil, 0, m.filesHTTPError(ctx, id, resp)
	}
	return &releasingReader{ReadCloser: resp.Body, release: release}, resp.ContentLength, nil
}

// releasingReader ends a files call when the download is closed.
type releasingReader struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

// Close closes the download and ends the call (once).
func (r *releasingReader) Close() error {
	err := r.ReadCloser.Close()
	r.once.Do(r.release)
	return err
}

// filesHTTPError maps the agent's /files JSON error ({code, message}):
// 400 (path) and 401 (user) are field errors, 404, 403 and 507 their
// classes, 502-504 ErrUnavailable, any other (the agent's 500) is
// node.ProblemAgentFailed.
func (m *Manager) filesHTTPError(ctx context.Context, id string, resp *http.Response) error {
	var body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body)
	msg := body.Message
	if msg == "" {
		msg = resp.Status
	}
	switch resp.StatusCode {
	case http.StatusBadRequest:
		return errdefs.InvalidField("path", "%s", msg)
	case http.StatusUnauthorized:
		return errdefs.InvalidField("user", "%s", msg)
	case http.StatusNotFound:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrNotFound)
	case http.StatusForbidden:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrPermissionDenied)
	case http.StatusInsufficientStorage:
		return fmt.Errorf("%s: %w", msg, errdefs.ErrInsufficientStorage)
	}
	if ended := m.endedError(ctx, id); ended != nil {
		return ended
	}
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return fmt.Errorf("agent files: %s: %w", msg, errdefs.ErrUnavailable)
	}
	// The agent answered and failed (a 500): the same call fails again.
	return agentFailed(msg)
}

// Stat describes path.
func (m *Manager) Stat(ctx context.Context, id, path, user string) (*node.Entry, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	sb, user, release, err := m.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	req := connect.NewRequest(&filesystempb.StatRequest{Path: path})
	setUser(req.Header(), user)
	resp, err := sb.agent.fs.Stat(ctx, req)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
	e := entryFromPB(resp.Msg.GetEntry())
	return &e, nil
}

// ListDir lists directory path down to depth levels (1 = its entries).
func (m *Manager) ListDir(ctx context.Context, id, path, user string, depth int) ([]node.Entry, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	if depth < 1 || depth > 32 {
		return nil, errdefs.InvalidField("depth", "must be between 1 and 32")
	}
	sb, user, release, err := m.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	req := connect.NewRequest(&filesystempb.ListDirRequest{Path: path, Depth: uint32(depth)})
	setUser(req.Header(), user)
	resp, err := sb.agent.fs.ListDir(ctx, req)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "path")
	}
	out := make([]node.Entry, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		out = append(out, entryFromPB(e))
	}
	return out, nil
}

// MakeDir creates directory path and its parents, owned by user.
// ErrConflict when it already exists.
func (m *Manager) MakeDir(ctx context.Context, id, path, user string) (*node.Entry, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	sb, user, release, err := m.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	req := connect.NewRequest(&filesystempb.MakeDirRequest{Path: path})
	setUser(req.Header(), user)
	resp, err := sb.agent.fs.MakeDir(ctx, req)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
	e := entryFromPB(resp.Msg.GetEntry())
	return &e, nil
}

// Move renames source to destination (creating destination's parents).
func (m *Manager) Move(ctx context.Context, id, source, destination, user string) (*node.Entry, error) {
	if err := checkPath("source", source); err != nil {
		return nil, err
	}
	if err := checkPath("destination", destination); err != nil {
		return nil, err
	}
	sb, user, release, err := m.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	req := connect.NewRequest(&filesystempb.MoveRequest{Source: source, Destination: destination})
	setUser(req.Header(), user)
	resp, err := sb.agent.fs.Move(ctx, req)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
	e := entryFromPB(resp.Msg.GetEntry())
	return &e, nil
}

// Remove deletes path (a directory with everything in it).
func (m *Manager) Remove(ctx context.Context, id, path, user string) error {
	if err := checkPath("path", path); err != nil {
		return err
	}
	if filepath.Clean("/"+path) == "/" {
		return errdefs.InvalidField("path", "refusing to remove /")
	}
	sb, user, release, err := m.fileCall(ctx, id, user)
	if err != nil {
		return err
	}
	defer release()
	req := connect.NewRequest(&filesystempb.RemoveRequest{Path: path})
	setUser(req.Header(), user)
	if _, err := sb.agent.fs.Remove(ctx, req); err != nil {
		return m.agentError(ctx, id, err, "")
	}
	return nil
}

// Usage reads the session's CPU seconds, memory (now and peak, bytes),
// tasks, OOM kills and the bytes its writable layer holds.
func (m *Manager) Usage(ctx context.Context, id string) (*node.Usage, error) {
	sb := m.find(ctx, id)
	if sb == nil || !isLive(sb.Record().State) {
		_, _, err := m.use(ctx, id) // the right error for an ended or unknown session
		return nil, err
	}
	st, err := m.driverOf(sb).Stats(ctx, id)
	if err != nil {
		if derr := m.checkDead(ctx, id); derr != nil {
			return nil, derr // it died by itself: 410 with the reason
		}
		return nil, err
	}
	u := &node.Usage{CPUSeconds: st.CPUSeconds, MemoryBytes: st.MemoryBytes, MemoryPeakBytes: st.MemoryPeakBytes,
		Pids: st.Pids, OOMKills: st.OOMKills}
	if u.DiskBytes, err = m.opts.Storage.Usage(ctx, id); err != nil {
		return nil, err
	}
	u.EgressBytes = m.egressBytes(ctx, sb)
	return u, nil
}
