package api

import (
	"net/http"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/version"
)

// handleInfo: GET /v1/info → the version, the drivers and the limits.
func (h *hostAPI) handleInfo(w http.ResponseWriter, r *http.Request) {
	n := h.mgr.Info()
	drivers, limits := info(n)
	writeJSON(w, http.StatusOK, v1.Info{
		Version: version.String(), EnvdVersion: version.EnvdVersion,
		Drivers: drivers, DefaultDriver: n.DefaultDriver, Limits: limits,
	})
}

// handleMetrics: GET /metrics (admin), the Prometheus exposition format.
func (h *hostAPI) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if h.metrics == nil {
		h.writeError(w, r, errdefs.Newf(errdefs.ErrUnavailable, "metrics are off"))
		return
	}
	h.metrics.Handler().ServeHTTP(w, r)
}
