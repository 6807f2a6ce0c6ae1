// Package httpjson reads JSON request bodies and writes JSON responses for
// forkbox's HTTP edges (the REST API and the E2B compatibility API). Bad
// bodies become *errdefs.FieldError values naming the offending field.
package httpjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Options adjust Decode.
type Options struct {
	// AllowEmpty decodes an empty body as {}.
	AllowEmpty bool
	// AllowUnknown ignores fields v does not have (for peers' wire formats,
	// which grow new optional fields).
	AllowUnknown bool
}

// Decode decodes the request body, at most limit bytes, into v: unknown
// fields (unless opt.AllowUnknown), trailing data, wrong types and
// oversized bodies are ErrInvalidArgument errors naming the field ("body"
// when no field applies).
func Decode(r *http.Request, v any, limit int64, opt Options) error {
	body := http.MaxBytesReader(nil, r.Body, limit)
	dec := json.NewDecoder(body)
	if !opt.AllowUnknown {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			if opt.AllowEmpty {
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

// Write writes v as JSON with status.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// DecodeMember strictly decodes raw, the value of member field of a
// request body read by a streaming decoder, into v, with Decode's errors:
// a wrong type or an unknown field names field (or field.sub for a field
// inside it).
func DecodeMember(field string, raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		err = jsonError(err)
		var fe *errdefs.FieldError
		if errors.As(err, &fe) {
			if fe.Field == "body" {
				fe.Field = field
			} else {
				fe.Field = field + "." + fe.Field
			}
		}
		return err
	}
	return nil
}

// BodyError maps an error reading a request body (larger than its limit,
// truncated) as Decode does.
func BodyError(err error) error { return jsonError(err) }
