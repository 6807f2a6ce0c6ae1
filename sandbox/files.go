package sandbox

import (
	"context"
	"io"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// Files owns a session's file calls: upload, download, stat, list, make
// directory, move and remove, each one envd filesystem call to the
// session's agent as a call in flight (an auto-paused session is resumed
// for it). It is safe for concurrent use.
type Files struct{ agentCalls }

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
func (fs *Files) fileCall(ctx context.Context, id, user string) (sb *Sandbox, _ string, release func(), err error) {
	sb, release, err = fs.m.use(ctx, id)
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

// resolve makes a relative path p of session sb's a path from the
// session's working directory, the directory exec starts commands in by
// default: the session's workdir, else its template's WORKDIR. Without
// either, p is left relative and the agent takes it from the user's home,
// which is then exec's default directory too. An absolute path, and one
// starting with "~" (the user's home, as envd reads it), is returned as
// it is.
func (fs *Files) resolve(sb *Sandbox, p string) string {
	if p == "" || strings.HasPrefix(p, "/") || strings.HasPrefix(p, "~") {
		return p
	}
	rec := sb.Record()
	wd := rec.Workdir
	if wd == "" {
		if tpl, err := storage.LoadTemplate(fs.m.opts.Layout.Template(rec.Template)); err == nil {
			wd = tpl.Workdir
		}
	}
	if wd == "" {
		return p
	}
	return path.Join(wd, p)
}

// Upload streams body into path (created with its parent directories,
// replaced atomically if it exists, owned by user). size is the body's
// length in bytes or -1 when unknown. ErrInsufficientStorage when the
// sandbox's disk is full.
func (fs *Files) Upload(ctx context.Context, id, path, user string, body io.Reader, size int64) (*node.Entry, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	sb, user, release, err := fs.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	written, err := sb.agent.Upload(ctx, fs.resolve(sb, path), user, body, size)
	if err != nil {
		return nil, fs.agentError(ctx, id, err, "")
	}
	return fs.Stat(ctx, id, written, user)
}

// Download opens path for reading. The caller closes the reader; size is
// the file's length in bytes.
func (fs *Files) Download(ctx context.Context, id, path, user string) (rc io.ReadCloser, size int64, err error) {
	if err := checkPathBytes("path", path); err != nil {
		return nil, 0, err
	}
	sb, user, release, err := fs.fileCall(ctx, id, user)
	if err != nil {
		return nil, 0, err
	}
	body, size, err := sb.agent.Download(ctx, fs.resolve(sb, path), user)
	if err != nil {
		defer release()
		return nil, 0, fs.agentError(ctx, id, err, "")
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
func (fs *Files) Stat(ctx context.Context, id, path, user string) (*node.Entry, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	sb, user, release, err := fs.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := sb.agent.Stat(ctx, fs.resolve(sb, path), user)
	if err != nil {
		return nil, fs.agentError(ctx, id, err, "")
	}
	return &e, nil
}

// ListDir lists directory path down to depth levels (1 = its entries).
func (fs *Files) ListDir(ctx context.Context, id, path, user string, depth int) ([]node.Entry, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	if depth < 1 || depth > 32 {
		return nil, errdefs.InvalidField("depth", "must be between 1 and 32")
	}
	sb, user, release, err := fs.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	out, err := sb.agent.ListDir(ctx, fs.resolve(sb, path), user, depth)
	if err != nil {
		return nil, fs.agentError(ctx, id, err, "path")
	}
	return out, nil
}

// MakeDir creates directory path and its parents, owned by user.
// ErrConflict when it already exists.
func (fs *Files) MakeDir(ctx context.Context, id, path, user string) (*node.Entry, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	sb, user, release, err := fs.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := sb.agent.MakeDir(ctx, fs.resolve(sb, path), user)
	if err != nil {
		return nil, fs.agentError(ctx, id, err, "")
	}
	return &e, nil
}

// Move renames source to destination (creating destination's parents).
func (fs *Files) Move(ctx context.Context, id, source, destination, user string) (*node.Entry, error) {
	if err := checkPath("source", source); err != nil {
		return nil, err
	}
	if err := checkPath("destination", destination); err != nil {
		return nil, err
	}
	sb, user, release, err := fs.fileCall(ctx, id, user)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := sb.agent.Move(ctx, fs.resolve(sb, source), fs.resolve(sb, destination), user)
	if err != nil {
		return nil, fs.agentError(ctx, id, err, "")
	}
	return &e, nil
}

// Remove deletes path (a directory with everything in it).
func (fs *Files) Remove(ctx context.Context, id, path, user string) error {
	if err := checkPath("path", path); err != nil {
		return err
	}
	if filepath.Clean("/"+path) == "/" {
		return errdefs.InvalidField("path", "refusing to remove /")
	}
	if rel := filepath.Clean(path); !strings.HasPrefix(path, "/") && (rel == ".." || strings.HasPrefix(rel, "../")) {
		// (it could name / or a home from the working directory)
		return errdefs.InvalidField("path", "a relative path to remove must stay in the working directory; give an absolute path")
	}
	sb, user, release, err := fs.fileCall(ctx, id, user)
	if err != nil {
		return err
	}
	defer release()
	if err := sb.agent.Remove(ctx, fs.resolve(sb, path), user); err != nil {
		return fs.agentError(ctx, id, err, "")
	}
	return nil
}
