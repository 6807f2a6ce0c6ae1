package agent

import (
	"encoding/json"
	"net/http"
	"path"
	"strings"

	"github.com/forkbox/forkbox/guest/wire"
)

// handleInit applies a wire.InitRequest: 204, or 400 with a JSON {code,
// message} body for a malformed request. It checks names, not whether the
// user or directory exists (the daemon checks that through the usual calls).
func (a *Agent) handleInit(w http.ResponseWriter, r *http.Request) {
	var req wire.InitRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "init: "+err.Error())
		return
	}
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			writeJSONError(w, http.StatusBadRequest, "init: bad environment variable "+k)
			return
		}
	}
	if strings.ContainsRune(req.Path, 0) {
		writeJSONError(w, http.StatusBadRequest, "init: path contains a NUL byte")
		return
	}
	if req.DefaultWorkdir != "" && !path.IsAbs(req.DefaultWorkdir) {
		writeJSONError(w, http.StatusBadRequest, "init: defaultWorkdir must be absolute")
		return
	}
	a.cfgMu.Lock()
	defer a.cfgMu.Unlock()
	env := make(map[string]string, len(a.cfg.Env)+len(req.EnvVars))
	for k, v := range a.cfg.Env {
		env[k] = v
	}
	for k, v := range req.EnvVars {
		env[k] = v
	}
	a.cfg.Env = env
	if req.DefaultUser != "" {
		a.cfg.DefaultUser = req.DefaultUser
	}
	if req.DefaultWorkdir != "" {
		a.cfg.Workdir = path.Clean(req.DefaultWorkdir)
	}
	if req.Path != "" {
		a.cfg.Path = req.Path
	}
	if req.CodeWarm && !a.cfg.CodeWarm {
		a.cfg.CodeWarm = true
		defer func() { go a.warmCode() }() // it reads the config: after cfgMu is released
	}
	w.WriteHeader(http.StatusNoContent)
}
