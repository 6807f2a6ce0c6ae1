package api

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/template"
	"github.com/forkbox/forkbox/tenancy"
)

// maxPullBody caps a pull request's JSON body, in bytes.
const maxPullBody = 64 << 10

// isPullRequest reports whether an import request is a pull: its body is
// JSON (an upload is a tarball).
func isPullRequest(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// handleTemplatePull: PUT /v1/templates/{name} with a JSON body
// (v1.TemplatePullRequest) pulls the template's image from its registry
// (template.Catalog.Pull). With Accept: text/event-stream the answer is
// the pull's events (v1.PullEvent) ending in a template or an error
// event; what fails before the first layer is fetched (the body, the
// name, the tenant's quota, the registry's refusal, a missing image, an
// unreachable registry) is a problem answer either way. Otherwise 201
// with the template. The credential in the body is used for this pull
// only: it is in no log, audit record or answer.
func (h *templateAPI) handleTemplatePull(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("template", name)
	var req v1.TemplatePullRequest
	if err := decodeJSON(r, &req, maxPullBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	access.NoteFrom(r.Context()).Set("ref", req.Ref)
	if req.Platform != "" {
		access.NoteFrom(r.Context()).Set("platform", req.Platform)
	}
	caller, hasCaller := tenancy.From(r.Context())
	if req.Shared && hasCaller && !caller.Admin {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrPermissionDenied, "only an admin key can import a shared template"))
		return
	}
	o := template.PullOptions{
		Platform: req.Platform, InsecureRegistries: req.InsecureRegistries, StartCmd: req.StartCmd,
		AnyAddress: !hasCaller || caller.Admin,
	}
	if req.Auth != nil {
		o.Auth = authn.FromConfig(authn.AuthConfig{Username: req.Auth.Username, Password: req.Auth.Password,
			Auth: req.Auth.Auth, IdentityToken: req.Auth.IdentityToken, RegistryToken: req.Auth.RegistryToken})
	}
	owner := ""
	if hasCaller && !req.Shared {
		owner = caller.Tenant
		release, err := h.reserveTemplate(r.Context(), owner)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		defer release()
		if o.MaxBytes, o.MaxBytesName, err = h.templateLimit(r.Context(), owner); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	var stream *pullStream
	if wantsEvents(r) {
		stream = &pullStream{out: newSSE(w)}
		o.Progress = stream.progress
	}
	t, err := h.catalog.Pull(r.Context(), owner, name, req.Ref, o)
	if err == nil && owner != "" {
		err = h.dropIfTenantGone(r.Context(), owner, name)
	}
	switch {
	case err != nil && (stream == nil || !stream.begun):
		h.writeError(w, r, err)
	case err != nil:
		p := h.problemOf(r, err)
		access.NoteFrom(r.Context()).Failed(strings.TrimPrefix(p.Type, problemPath), p.Detail)
		if r.Context().Err() == nil {
			h.log.Info("pull failed", "path", r.URL.Path, "request_id", w.Header().Get(requestIDHeader), "problem", p.Type, "detail", p.Detail)
			p.Instance, p.RequestID = r.URL.Path, w.Header().Get(requestIDHeader)
			_ = stream.out.jsonEvent("error", p)
		}
	case stream != nil:
		_ = stream.out.jsonEvent("template", templateView(t))
	default:
		writeJSON(w, http.StatusCreated, templateView(t))
	}
}

// wantsEvents reports whether the client asked for an event stream.
func wantsEvents(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// reserveTemplate holds a place of tenant's template quota until release
// (429 tenant-quota-exceeded when it has as many as it may keep).
func (h *templateAPI) reserveTemplate(ctx context.Context, tenant string) (release func(), err error) {
	return h.mgr.ReserveQuota(ctx, tenant, "templates", func() (int, error) {
		own, err := tenantTemplates(ctx, h.store, tenant)
		return len(own), err
	})
}

// templateLimit is tenant's max_template_mb in bytes (0: none) and how
// errors name it.
func (h *templateAPI) templateLimit(ctx context.Context, tenant string) (int64, string, error) {
	rec, err := h.store.GetTenant(ctx, tenant)
	if err != nil {
		return 0, "", err
	}
	p, err := admission.PolicyOf(rec)
	if err != nil {
		return 0, "", err
	}
	if p.MaxTemplateMB == 0 {
		return 0, "", nil
	}
	return p.MaxTemplateMB << 20, fmt.Sprintf("tenant %s's max_template_mb (%d MiB)", tenant, p.MaxTemplateMB), nil
}

// dropIfTenantGone deletes template name, just made for tenant, when the
// tenant was deleted meanwhile (an import that outlived its tenant is not
// kept): ErrPermissionDenied then.
func (h *templateAPI) dropIfTenantGone(ctx context.Context, tenant, name string) error {
	if _, err := h.store.GetTenant(ctx, tenant); errors.Is(err, errdefs.ErrNotFound) {
		_ = h.catalog.Delete(ctx, name)
		return errdefs.Newf(errdefs.ErrPermissionDenied, "tenant %s was deleted", tenant)
	}
	return nil
}

// pullStream sends a pull's progress as server-sent events.
type pullStream struct {
	out   *sseOutput
	begun bool // the 200 and the first event are out
}

// progress sends e (template.PullOptions.Progress: one call at a time).
func (s *pullStream) progress(e template.PullEvent) {
	if !s.begun {
		s.out.begin()
		s.begun = true
	}
	ev := v1.PullEvent{Digest: e.Digest, Platform: e.Platform}
	for _, l := range e.Layers {
		ev.Layers = append(ev.Layers, pullLayer(l))
	}
	if e.Kind == "layer" {
		l := pullLayer(e.Layer)
		ev.Layer = &l
	}
	_ = s.out.jsonEvent(e.Kind, ev)
}

// pullLayer is the API view of a layer's state.
func pullLayer(l template.LayerState) v1.PullLayer {
	return v1.PullLayer{Index: l.Index, Digest: l.Digest, Size: l.Size, Done: l.Done, Cached: l.Cached, Complete: l.Complete}
}
