package e2b

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/internal/version"
	"github.com/forkbox/forkbox/storage"
)

// templateInfo is components.schemas.Template, what GET /templates lists
// (the e2b CLI's `template list`). forkbox has no template builds: every
// template is "ready", built once (its import), and its sizes are the
// host's defaults for a sandbox made from it.
type templateInfo struct {
	TemplateID  string   `json:"templateID"`
	BuildID     string   `json:"buildID"`
	BuildStatus string   `json:"buildStatus"`
	BuildCount  int      `json:"buildCount"`
	CPUCount    int      `json:"cpuCount"`
	MemoryMB    int64    `json:"memoryMB"`
	DiskSizeMB  int64    `json:"diskSizeMB"`
	EnvdVersion string   `json:"envdVersion"`
	Public      bool     `json:"public"`
	Aliases     []string `json:"aliases"`
	Names       []string `json:"names"`
	CreatedAt   string   `json:"createdAt"`
	UpdatedAt   string   `json:"updatedAt"`
	// CreatedBy (a team user) and LastSpawnedAt are not kept: null.
	CreatedBy     *struct{}  `json:"createdBy"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
}

// templateAlias is components.schemas.TemplateAliasResponse.
type templateAlias struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// buildIDOf is a stable UUID-shaped build id for template t: a digest of
// its name and creation time, so a re-import shows a new build.
func buildIDOf(t *storage.Template) string {
	s := sha256.Sum256([]byte(t.Name + "\x00" + t.CreatedAt + "\x00" + t.Digest))
	return fmt.Sprintf("%x-%x-%x-%x-%x", s[0:4], s[4:6], s[6:8], s[8:10], s[10:16])
}

// handleTemplates: GET /templates[?teamID=] → 200 Template[]: the shared
// templates (public) and the caller's tenant's own (private), by name,
// with the built-in aliases. teamID is ignored (a key has one tenant).
func (h *Handler) handleTemplates(w http.ResponseWriter, r *http.Request) {
	if h.catalog == nil {
		httpjson.Write(w, http.StatusOK, []templateInfo{})
		return
	}
	ts, err := h.catalog.List(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	recs, err := h.keys.ListTemplates(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	shared := map[string]bool{}
	for _, rec := range recs {
		shared[rec.Name] = rec.Tenant == ""
	}
	limits := h.mgr.Info().Limits
	out := make([]templateInfo, 0, len(ts))
	for _, t := range ts {
		owner := t.Name
		if t.AliasOf != "" {
			owner = t.AliasOf
		}
		created := t.CreatedAt
		if created == "" {
			created = time.Unix(0, 0).UTC().Format(time.RFC3339)
		}
		out = append(out, templateInfo{
			TemplateID: t.Name, BuildID: buildIDOf(t), BuildStatus: "ready", BuildCount: 1,
			CPUCount: int(math.Ceil(limits.DefaultCPU)), MemoryMB: limits.DefaultMemoryMB, DiskSizeMB: limits.DefaultDiskMB,
			EnvdVersion: version.EnvdVersion, Public: shared[owner],
			Aliases: []string{t.Name}, Names: []string{t.Name}, CreatedAt: created, UpdatedAt: created,
		})
	}
	httpjson.Write(w, http.StatusOK, out)
}

// handleTemplateAlias: GET /templates/aliases/{alias} → 200
// TemplateAliasResponse (Template.exists, the CLI's alias check). 404
// when no template of that name is the caller's to use: unknown, or
// another tenant's (E2B answers 403 for another team's; forkbox does not
// tell that a name is taken by someone else).
func (h *Handler) handleTemplateAlias(w http.ResponseWriter, r *http.Request) {
	alias := r.PathValue("alias")
	notFound := func() { writeError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found", alias)) }
	if h.catalog == nil {
		notFound()
		return
	}
	t, err := h.catalog.Get(r.Context(), alias)
	if errors.Is(err, errdefs.ErrNotFound) {
		notFound()
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	owner := t.Name
	if t.AliasOf != "" {
		owner = t.AliasOf
	}
	rec, err := h.keys.GetTemplate(r.Context(), owner)
	if errors.Is(err, errdefs.ErrNotFound) {
		notFound() // files without a record: a failed import
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, templateAlias{TemplateID: alias, Public: rec.Tenant == ""})
}
