package api

import (
	"io"
	"net/http"
	"strconv"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"

	"github.com/forkbox/forkbox/errdefs"
)

// filePath returns the sandbox path named by the {path...} wildcard: an
// absolute path, or with ?relative=true the path as it is, which the
// session takes from its working directory (exec's default cwd).
func filePath(r *http.Request) (string, error) {
	p := r.PathValue("path")
	if p == "" {
		return "", errdefs.InvalidField("path", "is empty")
	}
	relative, err := boolParam(r, "relative")
	if err != nil {
		return "", err
	}
	if relative {
		return p, nil
	}
	return "/" + p, nil
}

// handleUpload: PUT /v1/sessions/{id}/files/{path...}[?user=NAME]: the raw
// body becomes the file (streamed; parents created; replaced atomically;
// owned by the user). 201 with the file's entry.
func (h *fileAPI) handleUpload(w http.ResponseWriter, r *http.Request) {
	p, err := filePath(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	note := access.NoteFrom(r.Context())
	note.Set("path", p)
	e, err := h.mgr.Upload(r.Context(), r.PathValue("id"), p, r.URL.Query().Get("user"), r.Body, r.ContentLength)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	note.Set("bytes", e.Size)
	writeJSON(w, http.StatusCreated, entry(e))
}

// handleDownload: GET /v1/sessions/{id}/files/{path...}[?user=NAME]
// streams the file's bytes: with Content-Length when the file's size is
// its length, chunked when it is not known (a /proc or /sys file).
func (h *fileAPI) handleDownload(w http.ResponseWriter, r *http.Request) {
	p, err := filePath(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	note := access.NoteFrom(r.Context())
	note.Set("path", p)
	rc, size, err := h.mgr.Download(r.Context(), r.PathValue("id"), p, r.URL.Query().Get("user"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	n, _ := io.Copy(w, rc)
	note.Set("bytes", n)
}

// handleRemove: DELETE /v1/sessions/{id}/files/{path...} removes a file or
// a directory tree. 204.
func (h *fileAPI) handleRemove(w http.ResponseWriter, r *http.Request) {
	p, err := filePath(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	access.NoteFrom(r.Context()).Set("path", p)
	if err := h.mgr.Remove(r.Context(), r.PathValue("id"), p, r.URL.Query().Get("user")); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleStat: GET /v1/sessions/{id}/fs/stat?path=P[&user=NAME].
func (h *fileAPI) handleStat(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	access.NoteFrom(r.Context()).Set("path", q.Get("path"))
	e, err := h.mgr.Stat(r.Context(), r.PathValue("id"), q.Get("path"), q.Get("user"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, entry(e))
}

// handleListDir: GET /v1/sessions/{id}/fs/list?path=P[&depth=N][&user=NAME].
func (h *fileAPI) handleListDir(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	access.NoteFrom(r.Context()).Set("path", q.Get("path"))
	depth := 1
	if d := q.Get("depth"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil {
			h.writeError(w, r, errdefs.InvalidField("depth", "must be an integer"))
			return
		}
		depth = n
	}
	list, err := h.mgr.ListDir(r.Context(), r.PathValue("id"), q.Get("path"), q.Get("user"), depth)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v1.EntryList{Entries: entries(list)})
}

// handleMkdir: POST /v1/sessions/{id}/fs/mkdir {"path": P, "user"?: NAME}.
// 201 with the entry; 409 when it exists.
func (h *fileAPI) handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req v1.PathRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	access.NoteFrom(r.Context()).Set("path", req.Path)
	e, err := h.mgr.MakeDir(r.Context(), r.PathValue("id"), req.Path, req.User)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, entry(e))
}

// handleMove: POST /v1/sessions/{id}/fs/move {"source", "destination", "user"?}.
func (h *fileAPI) handleMove(w http.ResponseWriter, r *http.Request) {
	var req v1.MoveRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	note := access.NoteFrom(r.Context())
	note.Set("path", req.Source)
	note.Set("destination", req.Destination)
	e, err := h.mgr.Move(r.Context(), r.PathValue("id"), req.Source, req.Destination, req.User)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, entry(e))
}
