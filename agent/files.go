package agent

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
)

// metadataHeaderPrefix starts request headers (in canonical form) whose
// values are stored on uploaded files as user.e2b.<lowercased rest> xattrs.
const metadataHeaderPrefix = "X-Metadata-"

// uploadBufSize is the copy buffer for one upload, in bytes.
const uploadBufSize = 256 << 10

// uploadTempPrefix starts the name of the temporary file an upload is
// written to before it is renamed over its destination, so that a failed
// upload never leaves a torn file. Directory watches hide these names and
// report the rename as the destination's CREATE and WRITE (watch.go).
const uploadTempPrefix = ".forkbox-upload-"

// uploadedFile is one element of a successful upload's JSON reply.
type uploadedFile struct {
	Path string `json:"path"` // absolute destination path
	Name string `json:"name"` // its last element
	Type string `json:"type"` // always "file"
}

// httpError is an error with the HTTP status the /files handlers reply with.
type httpError struct {
	status int
	msg    string
}

// Error returns the message sent to the client.
func (e *httpError) Error() string { return e.msg }

// badRequest returns a 400 httpError with a formatted message.
func badRequest(format string, args ...any) error {
	return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// writeJSONError replies with status and the body {"code": status, "message": msg}.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.Header().Del("Content-Disposition")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// writeFileError replies with the status for err (see fileErrorStatus)
// and err's message.
func writeFileError(w http.ResponseWriter, err error) {
	writeJSONError(w, fileErrorStatus(err), err.Error())
}

// fileErrorStatus maps an error from the /files handlers to an HTTP status:
// an httpError's own; missing -> 404; ENOSPC/EDQUOT -> 507 (Insufficient
// Storage); bad paths (ENOTDIR, EISDIR, EINVAL, ENAMETOOLONG, ELOOP) ->
// 400; EACCES/EPERM/EROFS -> 403; anything else 500.
func fileErrorStatus(err error) int {
	var he *httpError
	switch {
	case errors.As(err, &he):
		return he.status
	case errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return http.StatusInsufficientStorage
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		return http.StatusBadRequest
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

// fileUser resolves the `username` query parameter (else the Basic-auth
// user, else the default user). An unknown user is a 401 httpError.
func (a *Agent) fileUser(r *http.Request) (*account, error) {
	name := r.URL.Query().Get("username")
	if name == "" {
		name = userFromRequest(r.Header, a.config().DefaultUser)
	}
	acc, err := a.accounts.lookup(name)
	if err != nil {
		if connect.CodeOf(err) == connect.CodeUnauthenticated {
			return nil, &httpError{status: http.StatusUnauthorized, msg: err.Error()}
		}
		return nil, err
	}
	return acc, nil
}

// handleFileDownload serves GET /files?path=P[&username=U]: the regular
// file P (relative to U's home), streamed as application/octet-stream with
// its Content-Length (Range requests are honoured); a file whose size stat
// does not give (a /proc or /sys file, an empty one) is read to EOF and
// sent chunked, without Range support (streamToEOF). Errors are JSON bodies:
// 400 no path / a directory / not a regular file, 401 unknown user, 404
// missing, 403 permission, 500 otherwise. Responses are never compressed.
func (a *Agent) handleFileDownload(w http.ResponseWriter, r *http.Request) {
	acc, err := a.fileUser(r)
	if err != nil {
		writeFileError(w, err)
		return
	}
	p := r.URL.Query().Get("path")
	if p == "" {
		writeJSONError(w, http.StatusBadRequest, "the path query parameter is required")
		return
	}
	abs := resolvePath(p, acc.Home)
	fi, err := os.Stat(abs)
	if err != nil {
		if errors.Is(err, syscall.ENOTDIR) {
			err = &httpError{status: http.StatusNotFound, msg: err.Error()}
		}
		writeFileError(w, err)
		return
	}
	if fi.IsDir() {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("%s is a directory", abs))
		return
	}
	if !fi.Mode().IsRegular() {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("%s is not a regular file", abs))
		return
	}
	f, err := os.Open(abs)
	if err != nil {
		writeFileError(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if cd := mime.FormatMediaType("attachment", map[string]string{"filename": fi.Name()}); cd != "" {
		w.Header().Set("Content-Disposition", cd)
	}
	if sizeUnknown(f, fi.Size()) {
		streamToEOF(w, f)
		return
	}
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// handleFileUpload serves POST /files[?path=P][&username=U]. A
// multipart/form-data body carries one or more parts named "file", each
// written to its filename (P instead for the first part when given; more
// parts with P, or two parts for one path, are a 400 after the earlier ones
// were written). Any other body is the content of P. Content-Encoding: gzip
// bodies are decompressed. Each file is written atomically (see
// writeUploadedFile), owned by U; X-Metadata-<Key> headers become
// user.e2b.<key> xattrs. The reply is 200 with a JSON array of the files
// written, or a JSON error: 400 bad request, 401 unknown user, 507 no
// space, 403 permission, 500 otherwise.
func (a *Agent) handleFileUpload(w http.ResponseWriter, r *http.Request) {
	acc, err := a.fileUser(r)
	if err != nil {
		writeFileError(w, err)
		return
	}
	q := r.URL.Query()
	meta := map[string]string{}
	for k, v := range r.Header {
		if key, ok := strings.CutPrefix(k, metadataHeaderPrefix); ok && key != "" && len(v) > 0 {
			meta[strings.ToLower(key)] = v[0]
		}
	}
	var body io.Reader = r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, "bad gzip body: "+err.Error())
			return
		}
		defer gz.Close()
		body = gz
	default:
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("unsupported Content-Encoding %q", enc))
		return
	}

	var written []uploadedFile
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if strings.HasPrefix(mt, "multipart/") {
		written, err = writeMultipart(multipart.NewReader(body, params["boundary"]), q.Get("path"), acc, meta)
	} else {
		var f uploadedFile
		if f, err = writeUploadedFile(q.Get("path"), body, acc, meta); err == nil {
			written = append(written, f)
		}
	}
	if err != nil {
		writeFileError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(written)
}

// writeMultipart writes every part named "file" read from mr, in order, to
// the path in its Content-Disposition filename (pathParam instead for the
// first, when not empty), and returns the files written before any error.
func writeMultipart(mr *multipart.Reader, pathParam string, acc *account, meta map[string]string) ([]uploadedFile, error) {
	var written []uploadedFile
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return written, badRequest("bad multipart body: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		dest := pathParam
		if dest != "" && len(written) > 0 {
			part.Close()
			return written, badRequest("the path query parameter names a single file; send several files without it, each part's filename being its path (only the first file was written)")
		}
		if dest == "" {
			// Part.FileName keeps only the base name; the filename here is a path.
			_, dp, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if err != nil {
				part.Close()
				return written, badRequest("bad Content-Disposition %q: %v", part.Header.Get("Content-Disposition"), err)
			}
			dest = dp["filename"]
		}
		if dest == "" {
			part.Close()
			return written, badRequest("a file part has no filename and there is no path query parameter")
		}
		abs := resolvePath(dest, acc.Home)
		if seen[abs] {
			part.Close()
			return written, badRequest("%s appears twice in one upload; only the first was written", abs)
		}
		seen[abs] = true
		f, err := writeUploadedFile(dest, part, acc, meta)
		part.Close()
		if err != nil {
			return written, err
		}
		written = append(written, f)
	}
	if len(written) == 0 {
		return nil, badRequest("the multipart body has no part named \"file\"")
	}
	return written, nil
}

// bodyReader wraps the request body so that read errors (a broken or
// interrupted upload) can be told apart from write errors.
type bodyReader struct {
	r   io.Reader
	err error // the first read error other than io.EOF
}

// Read reads from the wrapped reader, recording a failure.
func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && b.err == nil {
		b.err = err
	}
	return n, err
}

// writeUploadedFile writes src to dest (relative to acc's home). Missing
// parent directories are created owned by acc. The data goes to a temporary
// file in the destination's directory, which is then chowned to acc, given
// mode 0644 (or the replaced file's mode), tagged with meta as
// user.e2b.<key> xattrs (best effort) and renamed over the destination; on
// any failure the temporary file is removed and the destination is left
// as it was. A destination that is a symlink to an existing file is written
// through (the target is replaced). Errors: 400 httpError for an empty path,
// a directory, a non-regular file or a body that cannot be read; otherwise
// the filesystem error.
func writeUploadedFile(dest string, src io.Reader, acc *account, meta map[string]string) (uploadedFile, error) {
	if dest == "" {
		return uploadedFile{}, badRequest("the path query parameter is required")
	}
	abs := resolvePath(dest, acc.Home)
	target := abs
	if fi, err := os.Lstat(abs); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			target = real
		}
	}
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(target); err == nil {
		if fi.IsDir() {
			return uploadedFile{}, badRequest("%s is a directory", abs)
		}
		if !fi.Mode().IsRegular() {
			return uploadedFile{}, badRequest("%s is not a regular file", abs)
		}
		mode = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	}
	dir := filepath.Dir(target)
	if err := mkdirAllOwned(dir, acc); err != nil {
		return uploadedFile{}, err
	}
	tmp, err := os.CreateTemp(dir, uploadTempPrefix+"*")
	if err != nil {
		return uploadedFile{}, tempError(err, abs)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	br := &bodyReader{r: src}
	if _, err := io.CopyBuffer(tmp, br, make([]byte, uploadBufSize)); err != nil {
		if br.err != nil {
			return uploadedFile{}, badRequest("reading the upload of %s: %v", abs, br.err)
		}
		return uploadedFile{}, renameInError(err, tmp.Name(), abs)
	}
	if err := tmp.Chown(int(acc.UID), int(acc.GID)); err != nil {
		return uploadedFile{}, renameInError(err, tmp.Name(), abs)
	}
	if err := tmp.Chmod(mode); err != nil { // after chown, which clears set-id bits
		return uploadedFile{}, renameInError(err, tmp.Name(), abs)
	}
	for k, v := range meta {
		_ = unix.Lsetxattr(tmp.Name(), xattrPrefix+k, []byte(v), 0)
	}
	if err := tmp.Close(); err != nil {
		return uploadedFile{}, renameInError(err, tmp.Name(), abs)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return uploadedFile{}, tempError(err, abs)
	}
	done = true
	return uploadedFile{Path: abs, Name: filepath.Base(abs), Type: "file"}, nil
}

// renameInError makes an error about the upload's temporary file name the
// destination instead (the temporary name means nothing to the client);
// the error class (errors.Is) is kept.
func renameInError(err error, tmp, dest string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == tmp {
		return &fs.PathError{Op: pe.Op, Path: dest, Err: pe.Err}
	}
	return err
}

// tempError is err of making, or renaming into place, the upload's
// temporary file (whose name means nothing to the client) as an error
// about dest: "open DEST: read-only file system". The error class
// (errors.Is) is kept.
func tempError(err error, dest string) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return &fs.PathError{Op: "open", Path: dest, Err: pe.Err}
	case errors.As(err, &le):
		return &fs.PathError{Op: "rename", Path: dest, Err: le.Err}
	}
	return err
}

// lookupError is fsError for looking a path up, where a path component that
// is not a directory (ENOTDIR) means the path does not exist.
func lookupError(err error) error {
	if errors.Is(err, syscall.ENOTDIR) {
		return connect.NewError(connect.CodeNotFound, err)
	}
	return fsError(err)
}

// fsError maps a filesystem error to a Connect error: missing -> not_found,
// EACCES/EPERM -> permission_denied, EROFS -> failed_precondition,
// ENOSPC/EDQUOT -> resource_exhausted, EEXIST -> already_exists, bad or
// mismatched paths -> invalid_argument, EXDEV/ENOTEMPTY ->
// failed_precondition, anything else -> internal. Connect errors pass through.
func fsError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, syscall.EROFS):
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("read-only file system: %w", err))
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("no space left: %w", err))
	case errors.Is(err, fs.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EBUSY):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, fs.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR),
		errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		code = connect.CodeInvalidArgument
	case errors.Is(err, syscall.EXDEV):
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("cannot move across filesystems: %w", err))
	}
	return connect.NewError(code, err)
}
