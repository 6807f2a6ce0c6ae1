package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/forkbox/forkbox/admission"
	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// tenantView is the API view of tenant t.
func (h *tenantAPI) tenantView(ctx context.Context, t *store.Tenant) (v1.Tenant, error) {
	p, err := admission.PolicyOf(t)
	if err != nil {
		return v1.Tenant{}, err
	}
	used, err := h.store.TenantCPU(ctx, t.Name, time.Now())
	if err != nil {
		return v1.Tenant{}, err
	}
	return v1.Tenant{Name: t.Name, Policy: v1.TenantPolicy(p), CreatedAt: t.CreatedAt, FlaggedAt: timePtr(t.FlaggedAt),
		FlagReason: t.FlagReason, Sessions: h.mgr.TenantSessions(t.Name), CPUSecondsToday: float64(used) / 1000}, nil
}

// handleCreateTenant: POST /v1/tenants {name, policy} (admin). 201.
func (h *tenantAPI) handleCreateTenant(w http.ResponseWriter, r *http.Request) {
	var req v1.TenantRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	access.NoteFrom(r.Context()).Set("tenant", req.Name)
	if err := tenancy.ValidateName("name", req.Name); err != nil {
		h.writeError(w, r, err)
		return
	}
	policy, err := policyJSON(&req.Policy)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	t := &store.Tenant{Name: req.Name, Policy: policy, CreatedAt: time.Now().UTC()}
	if err := h.store.CreateTenant(r.Context(), t); err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeTenant(w, r, http.StatusCreated, t)
}

// policyJSON validates p and returns it as stored.
func policyJSON(p *v1.TenantPolicy) (string, error) {
	tp := tenancy.Policy(*p)
	if err := admission.ValidatePolicy(&tp); err != nil {
		return "", err
	}
	b, err := json.Marshal(tp)
	return string(b), err
}

func (h *tenantAPI) writeTenant(w http.ResponseWriter, r *http.Request, status int, t *store.Tenant) {
	view, err := h.tenantView(r.Context(), t)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, status, view)
}

// handleTenants: GET /v1/tenants (admin).
func (h *tenantAPI) handleTenants(w http.ResponseWriter, r *http.Request) {
	ts, err := h.store.ListTenants(r.Context())
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.TenantList{Tenants: make([]v1.Tenant, 0, len(ts))}
	for _, t := range ts {
		view, err := h.tenantView(r.Context(), t)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		out.Tenants = append(out.Tenants, view)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleTenant: GET /v1/tenants/{name} (admin).
func (h *tenantAPI) handleTenant(w http.ResponseWriter, r *http.Request) {
	t, err := h.store.GetTenant(r.Context(), r.PathValue("name"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeTenant(w, r, http.StatusOK, t)
}

// handleUpdateTenant: PUT /v1/tenants/{name} {policy, clear_flag}
// (admin): replaces the policy. Sessions already running keep the sizes
// and network they were created with; new creates, the concurrency limit
// and the CPU budget follow the new policy at once.
func (h *tenantAPI) handleUpdateTenant(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	access.NoteFrom(r.Context()).Set("tenant", name)
	var req v1.TenantRequest
	if err := decodeJSON(r, &req, maxJSONBody, true); err != nil {
		h.writeError(w, r, err)
		return
	}
	if req.Name != "" && req.Name != name {
		h.writeError(w, r, errdefs.InvalidField("name", "a tenant cannot be renamed"))
		return
	}
	policy, err := policyJSON(&req.Policy)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := h.store.SetTenantPolicy(r.Context(), name, policy); err != nil {
		h.writeError(w, r, err)
		return
	}
	if req.ClearFlag {
		if err := h.store.FlagTenant(r.Context(), name, "", time.Time{}); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	t, err := h.store.GetTenant(r.Context(), name)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeTenant(w, r, http.StatusOK, t)
}

// handleDeleteTenant: DELETE /v1/tenants/{name}[?force=true] (admin).
// While it has sessions, snapshots, templates, volumes or volume
// snapshots it is 409, unless force. Then, in this order: the tenant is
// marked deleted and its keys removed (no new create, import or call of
// it can start), its sessions are destroyed, including creates still
// under way, and its snapshots, templates, volumes and volume snapshots
// deleted. Its records stay and its name is never reused. The
// default tenant cannot be deleted. 204.
func (h *tenantAPI) handleDeleteTenant(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ctx := r.Context()
	access.NoteFrom(ctx).Set("tenant", name)
	if name == store.DefaultTenant {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrConflict, "the default tenant cannot be deleted"))
		return
	}
	force, err := boolParam(r, "force")
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if _, err := h.store.GetTenant(ctx, name); err != nil {
		h.writeError(w, r, err)
		return
	}
	// Act as the tenant, so that its own snapshots and templates are visible.
	asTenant := tenancy.With(ctx, tenancy.Caller{Tenant: name, KeyID: callerKey(ctx), Admin: true,
		RequestID: w.Header().Get(requestIDHeader)})
	snaps, own, err := h.tenantLeftovers(asTenant, name)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	vols, err := h.tenantVolumes(asTenant)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	vsnaps, err := h.tenantVolumeSnapshots(asTenant)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if n := h.mgr.TenantSessions(name); (n > 0 || len(snaps) > 0 || len(own) > 0 || len(vols) > 0 || len(vsnaps) > 0) && !force {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrConflict,
			"tenant %s has %d sessions, %d snapshots, %d templates, %d volumes and %d volume snapshots; remove them first or force",
			name, n, len(snaps), len(own), len(vols), len(vsnaps)))
		return
	}
	if err := h.store.DeleteTenant(ctx, name); err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := h.mgr.EndTenant(ctx, name); err != nil {
		h.writeError(w, r, err)
		return
	}
	// No session of it is left, so no snapshot of it can be made any more.
	if snaps, own, err = h.tenantLeftovers(asTenant, name); err != nil {
		h.writeError(w, r, err)
		return
	}
	for _, sn := range snaps {
		if err := h.mgr.DeleteSnapshot(asTenant, sn.ID, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			h.writeError(w, r, fmt.Errorf("delete snapshot %s: %w", sn.ID, err))
			return
		}
	}
	for _, tpl := range own {
		if err := h.catalog.Delete(asTenant, tpl); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			h.writeError(w, r, fmt.Errorf("delete template %s: %w", tpl, err))
			return
		}
	}
	// Its volumes (no session mounts them any more: its copies went with
	// its sessions) and its volume snapshots, which outlive volumes.
	if vols, err = h.tenantVolumes(asTenant); err != nil {
		h.writeError(w, r, err)
		return
	}
	for _, v := range vols {
		if err := h.mgr.DeleteVolume(asTenant, v.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			h.writeError(w, r, fmt.Errorf("delete volume %s: %w", v.Name, err))
			return
		}
	}
	if vsnaps, err = h.tenantVolumeSnapshots(asTenant); err != nil {
		h.writeError(w, r, err)
		return
	}
	for _, sn := range vsnaps {
		if err := h.mgr.DeleteVolumeSnapshot(asTenant, sn.Volume, sn.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			h.writeError(w, r, fmt.Errorf("delete volume snapshot %s: %w", sn.ID, err))
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// tenantVolumes lists the volumes of the tenant ctx acts as (none on a
// daemon without volumes).
func (h *tenantAPI) tenantVolumes(ctx context.Context) ([]*node.Volume, error) {
	vs, err := h.mgr.ListVolumes(ctx)
	if noVolumes(err) {
		return nil, nil
	}
	return vs, err
}

// tenantVolumeSnapshots lists the volumes' own snapshots of the tenant
// ctx acts as, also those of volumes removed since (none on a daemon
// without volumes).
func (h *tenantAPI) tenantVolumeSnapshots(ctx context.Context) ([]*node.VolumeSnapshot, error) {
	sns, err := h.mgr.ListVolumeSnapshots(ctx, "")
	if noVolumes(err) {
		return nil, nil
	}
	return sns, err
}

// noVolumes reports whether err says the daemon has no volumes (no
// volume service, or storage that cannot hold them).
func noVolumes(err error) bool {
	return errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrInvalidArgument)
}

// tenantLeftovers lists tenant's snapshots and the names of its templates
// (ctx acts as the tenant).
func (h *tenantAPI) tenantLeftovers(ctx context.Context, tenant string) ([]*node.Snapshot, []string, error) {
	snaps, err := h.mgr.ListSnapshots(ctx)
	if err != nil {
		return nil, nil, err
	}
	own, err := tenantTemplates(ctx, h.store, tenant)
	return snaps, own, err
}

// tenantTemplates lists the names of the templates tenant imported, from
// the store's template records; the error is the store's.
func tenantTemplates(ctx context.Context, st *store.Store, tenant string) ([]string, error) {
	tpls, err := st.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	var own []string
	for _, t := range tpls {
		if t.Tenant == tenant {
			own = append(own, t.Name)
		}
	}
	return own, nil
}

func callerKey(ctx context.Context) string {
	c, _ := tenancy.From(ctx)
	return c.KeyID
}

// keyView is the API view of k.
func keyView(k *store.APIKey) v1.APIKey {
	return v1.APIKey{ID: k.ID, Name: k.Name, Tenant: k.Tenant, Admin: k.Admin, CreatedAt: k.CreatedAt,
		LastUsedAt: timePtr(k.LastUsedAt), RevokedAt: timePtr(k.RevokedAt)}
}

// handleCreateKey: POST /v1/tenants/{name}/keys {name, admin} (admin).
// 201 with the secret, shown once.
func (h *tenantAPI) handleCreateKey(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("name")
	note := access.NoteFrom(r.Context())
	note.Set("tenant", tenant)
	var req v1.KeyRequest
	if err := decodeJSON(r, &req, maxJSONBody, true); err != nil {
		h.writeError(w, r, err)
		return
	}
	if len(req.Name) > 128 || strings.ContainsFunc(req.Name, func(c rune) bool { return c < ' ' }) {
		h.writeError(w, r, errdefs.InvalidField("name", "must be at most 128 printable characters"))
		return
	}
	if _, err := h.store.GetTenant(r.Context(), tenant); err != nil {
		h.writeError(w, r, err)
		return
	}
	id, secret := tenancy.NewKey()
	k := store.APIKey{ID: id, Name: req.Name, Tenant: tenant, Admin: req.Admin}
	if err := h.store.AddAPIKey(r.Context(), k, secret); err != nil {
		h.writeError(w, r, err)
		return
	}
	note.Set("key", id)
	stored, err := h.store.GetAPIKey(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, v1.NewKey{APIKey: keyView(stored), Secret: secret})
}

// handleKeys: GET /v1/keys[?tenant=NAME] (admin).
func (h *tenantAPI) handleKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := h.store.ListAPIKeys(r.Context(), r.URL.Query().Get("tenant"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.KeyList{Keys: make([]v1.APIKey, 0, len(keys))}
	for _, k := range keys {
		out.Keys = append(out.Keys, keyView(k))
	}
	writeJSON(w, http.StatusOK, out)
}

// handleRevokeKey: DELETE /v1/keys/{id} (admin). A key cannot revoke
// itself (an install would lock itself out). 204.
func (h *tenantAPI) handleRevokeKey(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	access.NoteFrom(r.Context()).Set("key", id)
	if id == callerKey(r.Context()) {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrConflict, "a key cannot revoke itself; use another admin key"))
		return
	}
	if err := h.store.RevokeAPIKey(r.Context(), id); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
