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

// handleCreate: POST /v1/volumes {name, size_mb, from?} → 201 with the
// volume (with from, a copy of that volume snapshot); 409 when the name is
// taken; 400 naming name, size_mb or from.
func (h *volumeAPI) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req v1.VolumeRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	access.NoteFrom(r.Context()).Set("volume", req.Name)
	v, err := h.mgr.CreateVolume(r.Context(), req.Name, req.SizeMB, req.From)
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

// handleSnapshot: POST /v1/volumes/{name}/snapshots {name?} → 201 with the
// snapshot; 404 for no such volume; 409 for a taken name.
func (h *volumeAPI) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	var req v1.VolumeSnapshotRequest
	if err := decodeJSON(r, &req, maxJSONBody, true); err != nil {
		h.writeError(w, r, err)
		return
	}
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("volume", name)
	sn, err := h.mgr.SnapshotVolume(r.Context(), name, req.Name)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeSnapshotView(sn))
}

// handleSnapshots: GET /v1/volumes/{name}/snapshots → the volume's own
// snapshots, oldest first (also once it is gone); 404 when there is
// neither it nor a snapshot of it.
func (h *volumeAPI) handleSnapshots(w http.ResponseWriter, r *http.Request) {
	sns, err := h.mgr.ListVolumeSnapshots(r.Context(), r.PathValue("name"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.VolumeSnapshotList{Snapshots: []v1.VolumeSnapshot{}}
	for _, sn := range sns {
		out.Snapshots = append(out.Snapshots, volumeSnapshotView(sn))
	}
	writeJSON(w, http.StatusOK, out)
}

// handleDeleteSnapshot: DELETE /v1/volumes/{name}/snapshots/{snap} →
// 204; volumes made from it keep their data; 404 for none.
func (h *volumeAPI) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("volume", name)
	if err := h.mgr.DeleteVolumeSnapshot(r.Context(), name, r.PathValue("snap")); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
