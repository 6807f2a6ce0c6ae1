package api

import (
	"net/http"

	"github.com/forkbox/forkbox/internal/httpjson"
)

// maxJSONBody limits request bodies, in bytes (exec and stdin bodies:
// node.MaxExecBody).
const maxJSONBody = 1 << 20

// decodeJSON strictly decodes the request body into v (httpjson.Decode:
// one JSON object, exact-case names, unknown fields refused, a non-JSON
// Content-Type refused with 415, over limit bytes 413); an empty body
// decodes as {} when allowEmpty.
func decodeJSON(r *http.Request, v any, limit int64, allowEmpty bool) error {
	return httpjson.Decode(r, v, limit, httpjson.Options{AllowEmpty: allowEmpty})
}

// writeJSON writes v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v) }
