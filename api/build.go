package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"strings"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/build"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/template"
	"github.com/forkbox/forkbox/tenancy"
)

// maxBuildSpec caps a build's "spec" part, in bytes (the Dockerfile is in it).
const maxBuildSpec = 2 << 20

// maxBuildContext caps a build's context tar, in bytes.
const maxBuildContext = 4 << 30

// handleTemplateBuild: POST /v1/templates/{name}/build with a
// multipart/form-data body: a "spec" part (v1.TemplateBuildRequest, JSON)
// first, then an optional "context" part (the build context, a tar),
// which is spooled to the data directory and indexed, never unpacked on
// the host. The build runs as package build says; with Accept:
// text/event-stream the answer is its events (v1.BuildEvent) ending in a
// "build" or an "error" event; what fails before the first step (the
// body, the Dockerfile's syntax, the name, the tenant's quota) is a
// problem answer either way. Otherwise 201 with v1.TemplateBuild.
func (h *templateAPI) handleTemplateBuild(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("template", name)
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		h.writeError(w, r, errdefs.Typed(errdefs.ErrInvalidArgument, httpjson.ProblemUnsupportedMediaType,
			"a build's body is multipart/form-data: a \"spec\" part (JSON) and an optional \"context\" part (a tar)"))
		return
	}
	mr := multipart.NewReader(http.MaxBytesReader(w, r.Body, maxBuildContext+maxBuildSpec+1<<20), params["boundary"])
	req, err := readBuildSpec(mr)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if _, err := build.Parse([]byte(req.Dockerfile)); err != nil {
		h.writeError(w, r, err)
		return
	}
	caller, hasCaller := tenancy.From(r.Context())
	spec := build.Spec{Dockerfile: []byte(req.Dockerfile), BuildArgs: req.BuildArgs, Allow: req.Allow,
		Isolation: req.Isolation, CPU: req.CPU, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, StepTimeoutS: req.StepTimeoutS,
		Pull: template.PullOptions{InsecureRegistries: req.InsecureRegistries}, SpoolDir: h.spoolDir, ReadyTimeoutS: req.ReadyTimeoutS}
	if req.ReadyCmd != nil {
		if spec.ReadyCmd, err = build.ReadyLine("ready_cmd", *req.ReadyCmd); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	if err := build.ReadyTimeout("ready_timeout_s", req.ReadyTimeoutS); err != nil {
		h.writeError(w, r, err)
		return
	}
	release, err := h.holdBuildQuota(r.Context(), &spec)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	defer release()
	if err := h.catalog.CheckImportName(name); err != nil {
		h.writeError(w, r, err)
		return
	}
	bctx, cleanup, err := h.spoolContext(mr, spec.MaxBytes, spec.MaxName)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	spec.Context = bctx
	var stream *buildStream
	if wantsEvents(r) {
		stream = &buildStream{out: newSSE(w)}
		spec.Progress = stream.progress
	}
	res, err := h.builder.Build(r.Context(), name, spec)
	cleanup() // before the answer: a client that has it sees no spool left
	if err == nil && hasCaller {
		err = h.dropIfTenantGone(r.Context(), caller.Tenant, name)
	}
	switch {
	case err != nil && (stream == nil || !stream.begun):
		h.writeError(w, r, err)
	case err != nil:
		p := h.problemOf(r, err)
		access.NoteFrom(r.Context()).Failed(strings.TrimPrefix(p.Type, problemPath), p.Detail)
		if r.Context().Err() == nil {
			p.Instance, p.RequestID = r.URL.Path, w.Header().Get(requestIDHeader)
			_ = stream.out.jsonEvent("error", p)
		}
	case stream != nil:
		if !stream.begun { // (a Dockerfile of FROM alone has no step to begin it)
			stream.out.begin()
		}
		_ = stream.out.jsonEvent("build", buildView(res))
	default:
		writeJSON(w, http.StatusCreated, buildView(res))
	}
}

// readBuildSpec reads the body's first part, "spec", as a strict
// v1.TemplateBuildRequest (a "spec" field error otherwise).
func readBuildSpec(mr *multipart.Reader) (*v1.TemplateBuildRequest, error) {
	p, err := mr.NextPart()
	if err != nil {
		return nil, errdefs.InvalidField("spec", "the body has no \"spec\" part: %v", err)
	}
	defer p.Close()
	if p.FormName() != "spec" {
		return nil, errdefs.InvalidField("spec", "the first part is %q; the \"spec\" part comes first", p.FormName())
	}
	b, err := io.ReadAll(io.LimitReader(p, maxBuildSpec+1))
	if err != nil {
		return nil, errdefs.InvalidField("spec", "%v", err)
	}
	if len(b) > maxBuildSpec {
		return nil, httpjson.TooLarge("spec", maxBuildSpec)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var req v1.TemplateBuildRequest
	if err := dec.Decode(&req); err != nil {
		return nil, errdefs.InvalidField("spec", "not a build spec: %v", err)
	}
	if strings.TrimSpace(req.Dockerfile) == "" {
		return nil, errdefs.InvalidField("dockerfile", "required")
	}
	return &req, nil
}

// spoolContext spools the "context" part, if the body has one, into the
// upload spool and indexes it; cleanup closes and removes the spool. A
// context past limit bytes (> 0: the tenant's max_template_mb, which
// limitName names) is the 413 template-too-large, one past
// maxBuildContext the 413 content-too-large.
func (h *templateAPI) spoolContext(mr *multipart.Reader, limit int64, limitName string) (*build.Context, func(), error) {
	p, err := mr.NextPart()
	if errors.Is(err, io.EOF) {
		c, _ := build.OpenContext(nil)
		return c, func() {}, nil
	}
	if err != nil {
		return nil, nil, errdefs.InvalidField("context", "%v", err)
	}
	defer p.Close()
	if p.FormName() != "context" {
		return nil, nil, errdefs.InvalidField("context", "unexpected part %q (only \"spec\" and \"context\")", p.FormName())
	}
	f, err := os.CreateTemp(h.spoolDir, template.UploadPattern)
	if err != nil {
		return nil, nil, fmt.Errorf("spool the context: %w", err)
	}
	cleanup := func() { f.Close(); os.Remove(f.Name()) }
	var body io.Reader = p
	if limit > 0 {
		body = io.LimitReader(p, limit+1)
	}
	if err := h.spoolUpload(keepOpen{f}, body); err != nil {
		cleanup()
		return nil, nil, err
	}
	if fi, err := f.Stat(); err == nil && limit > 0 && fi.Size() > limit {
		cleanup()
		return nil, nil, errdefs.Typed(errdefs.ErrResourceExhausted, template.ProblemTemplateTooLarge,
			"the build context is larger than %s", limitName)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		cleanup()
		return nil, nil, err
	}
	c, err := build.OpenContext(f)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return c, cleanup, nil
}

// keepOpen is a spool file whose Close (spoolUpload's) only syncs it:
// the build reads it afterwards.
type keepOpen struct{ *os.File }

// Close syncs the file and leaves it open.
func (k keepOpen) Close() error { return k.Sync() }

// buildView is the API view of a finished build.
func buildView(res *build.Result) v1.TemplateBuild {
	out := v1.TemplateBuild{Template: templateView(res.Template), Sandboxes: res.Sandboxes, Steps: []v1.BuildStep{}}
	for _, s := range res.Steps {
		out.Steps = append(out.Steps, v1.BuildStep{Step: s.Step, Line: s.Line, Instruction: s.Instruction,
			Cached: s.Cached, Snapshot: s.Snapshot, DurationMS: s.DurationMS})
	}
	return out
}

// buildStream sends a build's progress as server-sent events.
type buildStream struct {
	out   *sseOutput
	begun bool
}

// progress sends e (build.Spec.Progress).
func (s *buildStream) progress(e build.Event) {
	if !s.begun {
		s.out.begin()
		s.begun = true
	}
	_ = s.out.jsonEvent(e.Kind, v1.BuildEvent{Step: e.Step, Total: e.Total, Line: e.Line, Instruction: e.Instruction,
		Cached: e.Cached, Snapshot: e.Snapshot, DurationMS: e.DurationMS, Stream: e.Stream, Data: e.Data, ExitCode: e.ExitCode})
}

// buildForE2B is the E2B edge's template builder (e2b.TemplateBuilder):
// the REST build's quota checks (the tenant's template count and
// max_template_mb, both held for the build) around package build, with
// the Dockerfile the edge made of the SDK's template and the merged
// uploads as the context.
func (h *templateAPI) buildForE2B(ctx context.Context, name string, dockerfile []byte, contextTar *os.File, progress func(build.Event)) error {
	caller, hasCaller := tenancy.From(ctx)
	spec := build.Spec{Dockerfile: dockerfile, Progress: progress, SpoolDir: h.spoolDir}
	release, err := h.holdBuildQuota(ctx, &spec)
	if err != nil {
		return err
	}
	defer release()
	if err := h.catalog.CheckImportName(name); err != nil {
		return err
	}
	bctx, err := build.OpenContext(contextTar)
	if err != nil {
		return err
	}
	defer bctx.Close()
	spec.Context = bctx
	if _, err := h.builder.Build(ctx, name, spec); err != nil {
		return err
	}
	if hasCaller {
		return h.dropIfTenantGone(ctx, caller.Tenant, name)
	}
	return nil
}

// holdBuildQuota applies ctx's caller to a build's spec: a pull of a FROM
// image may reach any address only for an admin (or no caller); a tenant's
// build must keep its allow-list within the tenant's egress ceiling (403
// egress-not-allowed naming the entry: its RUN steps and ADD downloads
// use it), holds a place of its template count (released by the returned
// func), takes its max_template_mb as the size limit, and holds a place
// for each template a FROM image is pulled into.
func (h *templateAPI) holdBuildQuota(ctx context.Context, spec *build.Spec) (release func(), err error) {
	caller, hasCaller := tenancy.From(ctx)
	spec.Pull.AnyAddress = !hasCaller || caller.Admin
	if !hasCaller {
		return func() {}, nil
	}
	if len(spec.Allow) > 0 {
		rec, err := h.store.GetTenant(ctx, caller.Tenant)
		if err != nil {
			return nil, err
		}
		p, err := admission.PolicyOf(rec)
		if err != nil {
			return nil, err
		}
		if err := admission.EgressViolation(p, spec.Allow); err != nil {
			if fe := (*errdefs.TypedError)(nil); errors.As(err, &fe) && fe.Field != "" {
				fe.Field = strings.Replace(fe.Field, "network.allow", "allow", 1)
			}
			return nil, err
		}
	}
	release, err = h.reserveTemplate(ctx, caller.Tenant)
	if err != nil {
		return nil, err
	}
	if spec.MaxBytes, spec.MaxName, err = h.templateLimit(ctx, caller.Tenant); err != nil {
		release()
		return nil, err
	}
	spec.ReservePull = func(ctx context.Context) (func(), error) { return h.reserveTemplate(ctx, caller.Tenant) }
	return release, nil
}
