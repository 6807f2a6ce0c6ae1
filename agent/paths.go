package agent

import (
	"encoding/base64"
	"net/http"
	"path"
	"strings"
)

// userFromRequest returns the user named in an HTTP Basic authorization
// header ("Basic base64(name:)", how E2B SDKs pass the exec user), or def.
func userFromRequest(h http.Header, def string) string {
	auth := h.Get("Authorization")
	if raw, ok := strings.CutPrefix(auth, "Basic "); ok {
		if dec, err := base64.StdEncoding.DecodeString(raw); err == nil {
			if name, _, _ := strings.Cut(string(dec), ":"); name != "" {
				return name
			}
		}
	}
	return def
}

// resolvePath makes p absolute: "~" and "~/x" expand to home, a relative
// path is taken from home, and the result is cleaned. The path is resolved
// by the kernel inside the sandbox's own mount namespace, so neither ".."
// nor a symlink can lead to the host.
func resolvePath(p, home string) string {
	switch {
	case p == "~":
		p = home
	case strings.HasPrefix(p, "~/"):
		p = path.Join(home, p[2:])
	case !strings.HasPrefix(p, "/"):
		p = path.Join(home, p)
	}
	return path.Clean(p)
}
