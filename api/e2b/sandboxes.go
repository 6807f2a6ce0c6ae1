package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/internal/version"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/volume"
)

// clientID fills the deprecated clientID field the schema still requires.
const clientID = "forkbox"

// newSandbox is the body of POST /sandboxes and /v2/sandboxes
// (components.schemas.NewSandboxV2, and NewSandbox of earlier SDKs).
type newSandbox struct {
	// TemplateID names a template, or a snapshot (by id or name) to
	// restore: E2B restores snapshots through this same field.
	TemplateID string `json:"templateID"`
	// Timeout is the lifetime in seconds (default 300).
	Timeout  *int64            `json:"timeout"`
	Metadata map[string]string `json:"metadata"`
	EnvVars  map[string]string `json:"envVars"`
	// AutoPause pauses instead of killing at the timeout
	// (lifecycle.onTimeout "pause"); AutoResume.Enabled then resumes the
	// sandbox on its next envd request.
	AutoPause  bool `json:"autoPause"`
	AutoResume *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	// AllowInternetAccess false is no network unless network.allowOut
	// lists some; true without an allowOut is refused (400
	// noOpenInternet): forkbox sandboxes reach only what an allow-list
	// names (SDKs up to 2.50 send true on every create).
	AllowInternetAccess *bool          `json:"allow_internet_access"`
	Network             *networkConfig `json:"network"`
	// MCP gateways are an E2B feature forkbox does not have; a create
	// that asks for one is refused rather than half done.
	MCP json.RawMessage `json:"mcp"`
	// VolumeMounts mounts the tenant's volumes read-write (forkbox's
	// /v1/volumes; E2B's SDK names them by name and path).
	VolumeMounts []volumeMount `json:"volumeMounts"`
}

// volumeMount is one entry of E2B's volumeMounts.
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// networkConfig is components.schemas.SandboxNetworkConfig, as far as
// forkbox reads it.
type networkConfig struct {
	AllowOut    []string        `json:"allowOut"`
	DenyOut     []string        `json:"denyOut"`
	Rules       json.RawMessage `json:"rules"`
	EgressProxy json.RawMessage `json:"egressProxy"`
	// AllowPublicTraffic opens the sandbox's ports to requests without a
	// token (ports.go). E2B's default is true; forkbox's is false (private):
	// a create must ask for it.
	AllowPublicTraffic *bool `json:"allowPublicTraffic"`
}

// sandboxView is components.schemas.Sandbox: what create, connect and
// resume return. The SDK reads sandboxID, envdVersion, envdAccessToken,
// trafficAccessToken and domain.
type sandboxView struct {
	SandboxID       string `json:"sandboxID"`
	TemplateID      string `json:"templateID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// TrafficAccessToken authorises calls of the sandbox's services other
	// than envd (its code-execution service, port 49999: code.go), which
	// the SDKs send as E2B-Traffic-Access-Token. Domain is null: envd and
	// that service are reached through E2B_SANDBOX_URL.
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// lifecycle is components.schemas.SandboxLifecycle.
type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// sandboxDetail is components.schemas.SandboxDetail (GET /sandboxes/{id})
// and, without the token and lifecycle, ListedSandbox (the list endpoints).
type sandboxDetail struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	State       string            `json:"state"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	// Only in SandboxDetail:
	EnvdAccessToken     string     `json:"envdAccessToken,omitempty"`
	Domain              *string    `json:"domain,omitempty"`
	AllowInternetAccess *bool      `json:"allowInternetAccess,omitempty"`
	Lifecycle           *lifecycle `json:"lifecycle,omitempty"`
}

// templateOf is the templateID E2B reports for a session: the snapshot it
// was restored from, else its template.
func templateOf(rec *node.Session) string {
	if rec.Snapshot != "" {
		return rec.Snapshot
	}
	return rec.Template
}

func viewOf(rec *node.Session) sandboxView {
	v := sandboxView{SandboxID: rec.ID, TemplateID: templateOf(rec), ClientID: clientID,
		EnvdVersion: version.EnvdVersion, EnvdAccessToken: rec.EnvdToken}
	if rec.TrafficToken != "" {
		tok := rec.TrafficToken
		v.TrafficAccessToken = &tok
	}
	return v
}

// listedOf is the ListedSandbox view of rec.
func listedOf(rec *node.Session) sandboxDetail {
	meta := rec.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	return sandboxDetail{
		SandboxID: rec.ID, TemplateID: templateOf(rec), ClientID: clientID,
		StartedAt: rec.StartedAt, EndAt: rec.ExpiresAt, State: string(rec.State),
		CPUCount: int(math.Ceil(rec.CPU)), MemoryMB: rec.MemoryMB, DiskSizeMB: rec.DiskMB,
		EnvdVersion: version.EnvdVersion, Metadata: meta,
	}
}

// detailOf is the SandboxDetail view of rec.
func detailOf(rec *node.Session) sandboxDetail {
	d := listedOf(rec)
	noNetwork := false
	d.EnvdAccessToken, d.AllowInternetAccess = rec.EnvdToken, &noNetwork
	d.Lifecycle = &lifecycle{OnTimeout: node.OnTimeoutKill, AutoResume: rec.AutoResume}
	if rec.OnTimeout == node.OnTimeoutPause {
		d.Lifecycle.OnTimeout = node.OnTimeoutPause
	}
	return d
}

// toCreateRequest checks an E2B create body and turns it into forkbox's.
// The template-or-snapshot decision is the caller's.
func (b *newSandbox) createSpec() (node.CreateSpec, error) {
	// No timeout: the server's default (300 s, as E2B's), capped at the
	// tenant's max_timeout_s.
	req := node.CreateSpec{Env: b.EnvVars, Metadata: b.Metadata}
	if b.Timeout != nil {
		if *b.Timeout < 1 {
			return req, errdefs.InvalidField("timeout", "must be at least 1 second")
		}
		req.TimeoutS = *b.Timeout
	}
	if b.AutoPause {
		req.OnTimeout = node.OnTimeoutPause
		req.AutoResume = b.AutoResume != nil && b.AutoResume.Enabled
	} else if b.AutoResume != nil && b.AutoResume.Enabled {
		return req, errdefs.InvalidField("autoResume", "needs autoPause (lifecycle.onTimeout 'pause')")
	}
	if b.AllowInternetAccess != nil && *b.AllowInternetAccess && (b.Network == nil || len(b.Network.AllowOut) == 0) {
		return req, errdefs.InvalidField("allow_internet_access", noOpenInternet)
	}
	if isSet(b.MCP) {
		return req, errdefs.InvalidField("mcp", "MCP gateways are not supported by forkbox")
	}
	for _, m := range b.VolumeMounts {
		req.Volumes = append(req.Volumes, node.VolumeMount{Name: m.Name, Path: m.Path})
	}
	if err := volume.CheckMounts(req.Volumes); err != nil {
		return req, errdefs.InvalidField("volumeMounts", "%v", err)
	}
	if n := b.Network; n != nil {
		if isSet(n.Rules) || isSet(n.EgressProxy) {
			return req, errdefs.InvalidField("network", "rules and egressProxy are not supported by forkbox")
		}
		if len(n.AllowOut) > 0 {
			req.Network = &node.Network{Allow: allowList(n.AllowOut)}
		}
		req.PublicTraffic = n.AllowPublicTraffic != nil && *n.AllowPublicTraffic
	}
	return req, nil
}

// allowList turns E2B's allowOut (CIDRs, bare IPs, names and *.names; any
// port) into forkbox's allow-list: addresses on every port, names on the
// web ports (80 and 443), which is what forkbox's proxy carries for names.
// denyOut needs no mapping: forkbox refuses whatever is not allowed.
func allowList(allowOut []string) []string {
	var out []string
	for _, e := range allowOut {
		switch {
		case strings.Contains(e, "/"):
			out = append(out, e)
		case net.ParseIP(e) != nil:
			if strings.Contains(e, ":") {
				out = append(out, e+"/128")
			} else {
				out = append(out, e+"/32")
			}
		default:
			out = append(out, e+":80", e+":443")
		}
	}
	return out
}

// isSet reports whether a raw JSON field was given a non-null value.
func isSet(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// handleCreate: POST /sandboxes and /v2/sandboxes → 201 Sandbox.
func (h *Handler) handleCreate(w http.ResponseWriter, r *http.Request) {
	var body newSandbox
	if err := decode(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	req, err := body.createSpec()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	req.Template = body.TemplateID
	if body.TemplateID != "" && !h.mgr.TemplateUsable(r.Context(), body.TemplateID) {
		// A snapshot id or name restores that snapshot, as in E2B (a
		// template of that name the caller can use wins).
		if sn, err := h.mgr.GetSnapshot(r.Context(), body.TemplateID); err == nil {
			req.Template, req.Snapshot = "", sn.ID
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			h.fail(w, r, err)
			return
		}
	}
	rec, _, err := h.mgr.Create(r.Context(), req, "")
	var fe *errdefs.FieldError
	if errors.As(err, &fe) && fe.Field == "template" {
		// E2B answers an unknown template with 404 (and this message).
		writeError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found: %s", body.TemplateID, fe.Reason))
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	access.NoteFrom(r.Context()).Session(rec.ID)
	httpjson.Write(w, http.StatusCreated, h.view(rec))
}

// session returns session id's record, or writes 404 for an unknown or
// ended one (E2B forgets killed sandboxes) and returns nil.
func (h *Handler) session(w http.ResponseWriter, r *http.Request) *node.Session {
	id := r.PathValue("id")
	rec, err := h.mgr.Get(r.Context(), id)
	// A sandbox already being torn down (its timeout fired, or another
	// kill) is gone for E2B's API, as it is at E2B the moment it ends.
	if err == nil && (rec.State == node.StateTerminated || rec.State == node.StateTerminating) {
		err = errdefs.Newf(errdefs.ErrNotFound, "sandbox %s ended (%s)", id, rec.Reason)
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
			return nil
		}
		h.fail(w, r, err)
		return nil
	}
	return rec
}

// timeoutBody is the body of connect, resume and timeout.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// handleConnect: POST /sandboxes/{id}/connect and /v2/... {"timeout"?: s}:
// resume a paused sandbox (201) or join a running one (200); either way
// its lifetime is extended to at least timeout (default 300 s) from now,
// never shortened (E2B's connect contract).
func (h *Handler) handleConnect(w http.ResponseWriter, r *http.Request) {
	h.connect(w, r, false)
}

// handleResume: POST /sandboxes/{id}/resume {"timeout"?: s}, the resume
// call of SDKs before connect existed: 201, or 409 when not paused.
func (h *Handler) handleResume(w http.ResponseWriter, r *http.Request) {
	h.connect(w, r, true)
}

func (h *Handler) connect(w http.ResponseWriter, r *http.Request, mustBePaused bool) {
	var body timeoutBody
	if err := decode(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	timeout := int64(defaults.SessionTimeoutS)
	if body.Timeout != nil {
		timeout = *body.Timeout
		if max := h.mgr.Info().Limits.MaxTimeoutS; timeout < 1 || timeout > max {
			h.fail(w, r, errdefs.InvalidField("timeout", "must be between 1 and %d seconds", max))
			return
		}
	}
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	status := http.StatusOK
	switch {
	case rec.State == node.StatePaused:
		resumed, err := h.mgr.Resume(r.Context(), rec.ID)
		if err != nil && !errors.Is(err, errdefs.ErrConflict) { // (a conflict: resumed meanwhile)
			h.fail(w, r, err)
			return
		}
		if resumed != nil {
			rec = resumed
		}
		status = http.StatusCreated
	case mustBePaused:
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is %s, not paused", rec.ID, rec.State))
		return
	case rec.State != node.StateRunning:
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is %s", rec.ID, rec.State))
		return
	}
	if time.Until(rec.ExpiresAt) < time.Duration(timeout)*time.Second {
		extended, err := h.mgr.SetTimeout(r.Context(), rec.ID, timeout)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		rec = extended
	}
	httpjson.Write(w, status, h.view(rec))
}

// handleGet: GET /sandboxes/{id} → 200 SandboxDetail.
func (h *Handler) handleGet(w http.ResponseWriter, r *http.Request) {
	if rec := h.session(w, r); rec != nil {
		httpjson.Write(w, http.StatusOK, h.detail(rec))
	}
}

// handleKill: DELETE /sandboxes/{id} → 204; 404 for an unknown or ended
// sandbox (the SDK's kill then returns false).
func (h *Handler) handleKill(w http.ResponseWriter, r *http.Request) {
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	if err := h.mgr.Destroy(r.Context(), rec.ID); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleTimeout: POST /sandboxes/{id}/timeout {"timeout": s} → 204: the
// sandbox now ends s seconds from now (longer or shorter than before).
func (h *Handler) handleTimeout(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if err := decode(r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	if body.Timeout == nil {
		h.fail(w, r, errdefs.InvalidField("timeout", "is required"))
		return
	}
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	if _, err := h.mgr.SetTimeout(r.Context(), rec.ID, *body.Timeout); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handlePause: POST /sandboxes/{id}/pause → 204; 409 when it is already
// paused (the SDK's pause then returns false).
func (h *Handler) handlePause(w http.ResponseWriter, r *http.Request) {
	rec := h.session(w, r)
	if rec == nil {
		return
	}
	if rec.State == node.StatePaused {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already paused", rec.ID))
		return
	}
	if _, err := h.mgr.Pause(r.Context(), rec.ID); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
