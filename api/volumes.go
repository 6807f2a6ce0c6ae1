package api

import (
	"net/http"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/node"
)

// volumeAPI serves the caller's tenant's volumes (/v1/volumes).
type volumeAPI struct {
	edge
	mgr node.Node
}

// handleCreate: POST /v1/volumes {name, size_mb} → 201 with the volume;
// 409 when the name is taken; 400 naming name or size_mb.
func (h *volumeAPI) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req v1.VolumeRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	access.NoteFrom(r.Context()).Set("volume", req.Name)
	v, err := h.mgr.CreateVolume(r.Context(), req.Name, req.SizeMB)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeView(v))
}

// handleList: GET /v1/volumes → the caller's volumes by name.
func (h *volumeAPI) handleList(w http.ResponseWriter, r *http.Request) {
	vs, err := h.mgr.ListVolumes(r.Context())
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.VolumeList{Volumes: []v1.Volume{}}
	for _, v := range vs {
		out.Volumes = append(out.Volumes, volumeView(v))
	}
	writeJSON(w, http.StatusOK, out)
}

// handleGet: GET /v1/volumes/{name} → the volume; 404 for none.
func (h *volumeAPI) handleGet(w http.ResponseWriter, r *http.Request) {
	v, err := h.mgr.GetVolume(r.Context(), r.PathValue("name"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, volumeView(v))
}

// handleDelete: DELETE /v1/volumes/{name} → 204; 409 while a session
// mounts it; 404 for none.
func (h *volumeAPI) handleDelete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("volume", name)
	if err := h.mgr.DeleteVolume(r.Context(), name); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
