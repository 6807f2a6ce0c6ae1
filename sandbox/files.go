package sandbox

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

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
	written, err := sb.agent.Upload(ctx, path, user, body, size)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
	return m.Stat(ctx, id, written, user)
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
	body, size, err := sb.agent.Download(ctx, path, user)
	if err != nil {
		defer release()
		return nil, 0, m.agentError(ctx, id, err, "")
	}
	return &releasingReader{ReadCloser: body, release: release}, size, nil
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
	e, err := sb.agent.Stat(ctx, path, user)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
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
	out, err := sb.agent.ListDir(ctx, path, user, depth)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "path")
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
	e, err := sb.agent.MakeDir(ctx, path, user)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
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
	e, err := sb.agent.Move(ctx, source, destination, user)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
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
	if err := sb.agent.Remove(ctx, path, user); err != nil {
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
