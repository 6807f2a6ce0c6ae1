package api

import (
	"errors"
	"io"
	"mime"
	"net/http"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/broker"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// secretAPI serves the caller's tenant's secrets (/v1/secrets): set, list,
// remove; values go in and never come out.
type secretAPI struct {
	edge
	svc *broker.Secrets // nil until SetSecrets: 503
}

// SetSecrets serves /v1/secrets with svc (the daemon's credential broker).
// Call it before serving; without it those routes answer 503.
func (s *Server) SetSecrets(svc *broker.Secrets) { s.secrets.svc = svc }

// secretView is the API view of spec (no value).
func secretView(spec broker.Spec) v1.Secret {
	return v1.Secret{Name: spec.Name, Hosts: append([]string{}, spec.Hosts...), Header: spec.Header}
}

// service returns the secret service and the caller's tenant, or writes
// 503 and returns nil.
func (h *secretAPI) service(w http.ResponseWriter, r *http.Request) (*broker.Secrets, string) {
	if h.svc == nil {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrUnavailable, "this daemon has no credential broker"))
		return nil, ""
	}
	return h.svc, tenancy.TenantOf(r.Context(), store.DefaultTenant)
}

// handleSet: PUT /v1/secrets/{name}, a JSON v1.SecretRequest, or the value
// as the whole body (any other Content-Type) with ?host= (repeated) and
// ?header=. 201 when new, 200 when it replaced one; field errors name
// name, hosts, header or value.
func (h *secretAPI) handleSet(w http.ResponseWriter, r *http.Request) {
	svc, tenant := h.service(w, r)
	if svc == nil {
		return
	}
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("secret", name)
	var req v1.SecretRequest
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "application/json" {
		if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
			h.writeError(w, r, err)
			return
		}
	} else {
		q := r.URL.Query()
		req.Hosts, req.Header = q["host"], q.Get("header")
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, broker.MaxValue+1))
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.writeError(w, r, errdefs.InvalidField("value", "more than %d bytes", broker.MaxValue))
			return
		}
		if err != nil {
			h.writeError(w, r, errdefs.Newf(errdefs.ErrInvalidArgument, "read the value: %v", err))
			return
		}
		req.Value = string(b)
	}
	spec, replaced, err := svc.Set(r.Context(), tenant, broker.Spec{Name: name, Hosts: req.Hosts, Header: req.Header}, []byte(req.Value))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	status := http.StatusCreated
	if replaced {
		status = http.StatusOK
	}
	w.Header().Set("Location", "/v1/secrets/"+spec.Name)
	writeJSON(w, status, secretView(spec))
}

// handleList: GET /v1/secrets: the tenant's secrets by name, no values.
func (h *secretAPI) handleList(w http.ResponseWriter, r *http.Request) {
	svc, tenant := h.service(w, r)
	if svc == nil {
		return
	}
	specs, err := svc.List(r.Context(), tenant)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.SecretList{Secrets: []v1.Secret{}}
	for _, s := range specs {
		out.Secrets = append(out.Secrets, secretView(s))
	}
	writeJSON(w, http.StatusOK, out)
}

// handleGet: GET /v1/secrets/{name}, no value; 404 when the tenant has none.
func (h *secretAPI) handleGet(w http.ResponseWriter, r *http.Request) {
	svc, tenant := h.service(w, r)
	if svc == nil {
		return
	}
	spec, err := svc.Get(r.Context(), tenant, r.PathValue("name"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretView(spec))
}

// handleRemove: DELETE /v1/secrets/{name}: 204; every placeholder for it
// stops working at once. 404 when the tenant has none.
func (h *secretAPI) handleRemove(w http.ResponseWriter, r *http.Request) {
	svc, tenant := h.service(w, r)
	if svc == nil {
		return
	}
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("secret", name)
	if err := svc.Remove(r.Context(), tenant, name); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
