package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Request body limits in bytes.
const (
	maxJSONBody = 1 << 20
	// maxExecBody allows stdin data inline in an exec request.
	maxExecBody = 32 << 20
)

// decodeJSON strictly decodes the request body into v: unknown fields,
// trailing data, wrong types and oversized bodies are errors naming the
// field ("body" when no field applies). An empty body decodes as {} when
// allowEmpty is set.
func decodeJSON(r *http.Request, v any, limit int64, allowEmpty bool) error {
	body := http.MaxBytesReader(nil, r.Body, limit)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			if allowEmpty {
				return nil
			}
			return errdefs.InvalidField("body", "is empty; a JSON object is required")
		}
		return jsonError(err)
	}
	if dec.More() {
		return errdefs.InvalidField("body", "has data after the JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var big *http.MaxBytesError
		if errors.As(err, &big) { // only whitespace so far, but too much of it
			return jsonError(err)
		}
		return errdefs.InvalidField("body", "has data after the JSON object")
	}
	return nil
}

// jsonError turns a json decoding error into a FieldError.
func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var big *http.MaxBytesError
	switch {
	case errors.As(err, &syn):
		return errdefs.InvalidField("body", "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return errdefs.InvalidField(field, "must be %s, not %s", typeName(typ.Type.Kind().String()), typ.Value)
	case errors.As(err, &big):
		return errdefs.InvalidField("body", "larger than %d bytes", big.Limit)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.InvalidField("body", "truncated JSON")
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return errdefs.InvalidField(strings.Trim(name, `"`), "unknown field")
	}
	return errdefs.InvalidField("body", "%v", err)
}

func typeName(kind string) string {
	switch kind {
	case "int", "int64", "int32", "uint32", "uint64":
		return "an integer"
	case "float64":
		return "a number"
	case "string":
		return "a string"
	case "map", "struct":
		return "an object"
	case "slice":
		return "an array"
	case "bool":
		return "true or false"
	}
	return fmt.Sprintf("a %s", kind)
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
