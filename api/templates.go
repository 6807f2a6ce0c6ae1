package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/tenancy"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/template"
)

// maxTemplateUpload caps an uploaded image tarball, in bytes.
const maxTemplateUpload = 64 << 30

// templateView is the API view of a template. An older import's Source
// is the host path of its upload: it shows as "upload".
func templateView(t *storage.Template) v1.Template {
	source := t.Source
	if filepath.IsAbs(source) {
		source = "upload"
	}
	return v1.Template{Name: t.Name, Source: source, Digest: t.Digest, Env: t.Env, Workdir: t.Workdir,
		User: t.User, Cmd: t.Cmd, StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd, ReadyTimeoutS: t.ReadyTimeoutS,
		WarmSnapshot: t.WarmSnapshot, Layers: t.Layers,
		SizeBytes: t.SizeBytes, CreatedAt: t.CreatedAt, AliasOf: t.AliasOf, Tier: t.Tier}
}

func (h *templateAPI) handleTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := h.catalog.List(r.Context())
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := make([]v1.Template, 0, len(ts))
	for _, t := range ts {
		out = append(out, templateView(t))
	}
	writeJSON(w, http.StatusOK, v1.TemplateList{Templates: out})
}

func (h *templateAPI) handleTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := h.catalog.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateView(t))
}

// handleTemplateImport: PUT /v1/templates/{name}[?ref=REF][&source=LABEL]
// [&start_cmd=true][&shared=true] with a tarball body (`docker save`
// output, or an OCI image layout packed as a tar). The body is spooled to
// the data directory, then unpacked safely. source is what the
// template's source shows (the CLI sends the file's name; default
// "upload"); start_cmd keeps the image's ENTRYPOINT and CMD as the
// template's start command. 201. A JSON body pulls the image from a
// registry instead (handleTemplatePull).
func (h *templateAPI) handleTemplateImport(w http.ResponseWriter, r *http.Request) {
	if isPullRequest(r) {
		h.handleTemplatePull(w, r)
		return
	}
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("template", name)
	shared, err := boolParam(r, "shared")
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	startCmd, err := boolParam(r, "start_cmd")
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	source := r.URL.Query().Get("source")
	if err := template.CheckSource(source); err != nil {
		h.writeError(w, r, err)
		return
	}
	if caller, _ := tenancy.From(r.Context()); shared && !caller.Admin {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrPermissionDenied, "only an admin key can import a shared template"))
		return
	}
	// The tenant's template quota: a place is held until the import is in.
	var maxBytes int64
	var maxName string
	if caller, ok := tenancy.From(r.Context()); ok && !shared {
		release, err := h.reserveTemplate(r.Context(), caller.Tenant)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		defer release()
		if maxBytes, maxName, err = h.templateLimit(r.Context(), caller.Tenant); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	// Refuse before receiving what may be gigabytes.
	if err := h.catalog.CheckImportName(name); err != nil {
		h.writeError(w, r, err)
		return
	}
	spool, err := os.CreateTemp(h.spoolDir, template.UploadPattern)
	if err != nil {
		h.writeError(w, r, fmt.Errorf("spool the upload: %w", err)) // (internal: the detail is not shown)
		return
	}
	defer os.Remove(spool.Name())
	if err := h.spoolUpload(spool, http.MaxBytesReader(w, r.Body, maxTemplateUpload)); err != nil {
		h.writeError(w, r, err)
		return
	}
	t, err := h.catalog.Import(r.Context(), name, spool.Name(), template.ImportOptions{
		Ref: r.URL.Query().Get("ref"), Source: source, Shared: shared, StartCmd: startCmd,
		MaxBytes: maxBytes, MaxBytesName: maxName})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	// An import that outlived its tenant's deletion is not kept.
	if caller, ok := tenancy.From(r.Context()); ok && !shared {
		if err := h.dropIfTenantGone(r.Context(), caller.Tenant, name); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusCreated, templateView(t))
}

func (h *templateAPI) handleTemplateDelete(w http.ResponseWriter, r *http.Request) {
	access.NoteFrom(r.Context()).Set("template", r.PathValue("name"))
	// The memory snapshot of a template's started server refers to the
	// template: it goes first (a 409 while sessions restored from it
	// hold it, as the template's own sessions would).
	if t, err := h.catalog.Get(r.Context(), r.PathValue("name")); err == nil && t.WarmSnapshot != "" {
		if err := h.warmDeleteBlocked(r.Context(), t.Name, t.WarmSnapshot); err != nil {
			h.writeError(w, r, err) // (a refused delete keeps the warm snapshot)
			return
		}
		if err := h.mgr.DeleteSnapshot(r.Context(), t.WarmSnapshot, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			h.writeError(w, r, err)
			return
		}
	}
	if err := h.catalog.Delete(r.Context(), r.PathValue("name")); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// spoolUpload copies an uploaded image from body into the spool file f
// and closes f. Errors name no host path: a body over maxTemplateUpload
// is content-too-large (413), a body cut short a "body" field error, a
// full disk under the data directory insufficient storage, other write
// errors internal (the spool's path goes to the log only).
func (h *templateAPI) spoolUpload(f spoolFile, body io.Reader) error {
	var readErr error
	_, err := io.Copy(f, readerFunc(func(p []byte) (int, error) {
		n, err := body.Read(p)
		if err != nil && err != io.EOF {
			readErr = err
		}
		return n, err
	}))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	var big *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(readErr, &big):
		return httpjson.TooLarge("body", big.Limit)
	case readErr != nil:
		return errdefs.InvalidField("body", "upload cut short: %v", readErr)
	}
	h.log.Error("spool a template upload", "file", f.Name(), "err", err)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errdefs.Newf(errdefs.ErrInsufficientStorage, "no room on the forkbox host for the upload")
	}
	return fmt.Errorf("spool the upload: %w", errdefs.ErrInternal)
}

// spoolFile is where spoolUpload writes: the spool file (or a wrapper
// whose Close keeps it open for a reader after).
type spoolFile interface {
	io.WriteCloser
	Name() string
}

// readerFunc is an io.Reader made of a function.
type readerFunc func([]byte) (int, error)

// Read calls f.
func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
