// Package httpjson reads JSON request bodies and writes JSON responses for
// forkbox's HTTP edges (the REST API and the E2B compatibility API). Bad
// bodies become *errdefs.FieldError values naming the offending field, or
// *errdefs.TypedError values for a body that is too large or not JSON.
//
// forkbox's own API decodes strictly (RFC 8259 JSON, exact-case member
// names, no unknown or duplicate members, an object at the top). A peer's
// wire format (E2B's) is decoded the way that peer's own server decodes it
// (Go's encoding/json): see Options.Peer.
package httpjson

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/forkbox/forkbox/errdefs"
)

// Problem types (errdefs.TypedError.Type) of bodies refused before they are
// decoded. Both are of class errdefs.ErrInvalidArgument.
const (
	// ProblemContentTooLarge: the body is over the endpoint's limit (HTTP
	// 413, RFC 9110 §15.5.14).
	ProblemContentTooLarge = "content-too-large"
	// ProblemUnsupportedMediaType: the body's Content-Type is not JSON
	// (HTTP 415, RFC 9110 §15.5.16).
	ProblemUnsupportedMediaType = "unsupported-media-type"
)

// Options adjust Decode.
type Options struct {
	// AllowEmpty decodes an empty body as {}.
	AllowEmpty bool
	// Peer decodes a peer's wire format as the peer's own server (Go's
	// encoding/json) does: member names match case-insensitively, unknown
	// members are ignored (peers add optional fields often), the
	// Content-Type is not looked at, and a top-level null is {}.
	Peer bool
}

// Decode decodes the request body, at most limit bytes, into v (a pointer
// to a struct).
//
// Without opt.Peer the body must be one JSON object: its member names match
// v's JSON names exactly (case included), unknown and duplicate members,
// trailing data, invalid UTF-8 and a top-level null, array or scalar are
// refused. A body whose Content-Type is given and is not JSON
// (application/json, with any parameters but a charset other than UTF-8,
// or a structured-syntax type ending in "+json": RFC 6839 §3.1) is refused
// with ProblemUnsupportedMediaType, naming the field "Content-Type"; a
// body without Content-Type is read as JSON.
//
// A body over limit is a TypedError of ProblemContentTooLarge naming the
// field "body"; every other bad body is an ErrInvalidArgument FieldError
// naming the member at fault (dotted: "limits.pids", "env.PATH"), or
// "body" when none applies. An empty (or all-whitespace) body decodes as
// {} when opt.AllowEmpty, else it is a "body" field error.
func Decode(r *http.Request, v any, limit int64, opt Options) error {
	body := bufio.NewReader(http.MaxBytesReader(nil, r.Body, limit))
	first, err := firstByte(body)
	switch {
	case errors.Is(err, io.EOF):
		if opt.AllowEmpty {
			return nil
		}
		return errdefs.InvalidField("body", "is empty; a JSON object is required")
	case err != nil:
		return readError(err)
	}
	if opt.Peer {
		return decodePeer(body, v)
	}
	if err := CheckMediaType(r.Header.Get("Content-Type")); err != nil {
		return err
	}
	dec := jsontext.NewDecoder(body, jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	if first != '{' {
		val, err := dec.ReadValue()
		switch {
		case err != nil:
			return strictError(err)
		case val.Kind() == 'n':
			return errdefs.InvalidField("body", "is null; a JSON object is required")
		}
		return errdefs.InvalidField("body", "must be an object, not %s", kindName(val.Kind()))
	}
	if err := jsonv2.UnmarshalDecode(dec, v, jsonv2.RejectUnknownMembers(true),
		jsonv2.MatchCaseInsensitiveNames(false)); err != nil {
		return strictError(err)
	}
	if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
		if err := readError(err); isTooLarge(err) {
			return err // only whitespace so far, but too much of it
		}
		return errdefs.InvalidField("body", "has data after the JSON object")
	}
	return nil
}

// CheckMediaType returns nil when a request body with Content-Type ct may
// be read as JSON: ct is empty (no Content-Type), application/json (a
// charset parameter must name UTF-8, RFC 8259 §8.1) or a "+json" type;
// else a TypedError of ProblemUnsupportedMediaType naming the field
// "Content-Type".
func CheckMediaType(ct string) error {
	if strings.TrimSpace(ct) == "" {
		return nil
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return unsupported("Content-Type %q is malformed; send application/json", ct)
	}
	if mt != "application/json" && !(strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return unsupported("Content-Type %s is not JSON; send application/json", mt)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return unsupported("charset %s is not supported; JSON bodies are UTF-8", cs)
	}
	return nil
}

func unsupported(format string, args ...any) error {
	te := errdefs.Typed(errdefs.ErrInvalidArgument, ProblemUnsupportedMediaType, format, args...)
	te.Field = "Content-Type"
	return te
}

// firstByte returns the first byte of br after JSON whitespace, leaving
// it unread.
func firstByte(br *bufio.Reader) (byte, error) {
	for {
		b, err := br.Peek(1)
		if err != nil {
			return 0, err
		}
		switch b[0] {
		case ' ', '\t', '\r', '\n':
			_, _ = br.Discard(1)
			continue
		}
		return b[0], nil
	}
}

// decodePeer decodes one JSON value from body into v with Go's
// encoding/json (case-insensitive names, unknown members ignored).
func decodePeer(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		return peerError(err)
	}
	if dec.More() {
		return errdefs.InvalidField("body", "has data after the JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err := readError(err); isTooLarge(err) {
			return err
		}
		return errdefs.InvalidField("body", "has data after the JSON object")
	}
	return nil
}

// TooLarge returns the ErrInvalidArgument TypedError of
// ProblemContentTooLarge for field (the "body"), over limit bytes.
func TooLarge(field string, limit int64) error {
	te := errdefs.Typed(errdefs.ErrInvalidArgument, ProblemContentTooLarge, "%s: larger than %d bytes", field, limit)
	te.Field = field
	return te
}

// readError maps an error reading the body: over the limit is
// ProblemContentTooLarge; anything else a "body" field error.
func readError(err error) error {
	var big *http.MaxBytesError
	if errors.As(err, &big) {
		return TooLarge("body", big.Limit)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errdefs.InvalidField("body", "truncated JSON")
	}
	return errdefs.InvalidField("body", "could not be read: %v", err)
}

func isTooLarge(err error) bool {
	var te *errdefs.TypedError
	return errors.As(err, &te) && te.Type == ProblemContentTooLarge
}

// strictError turns an error of the strict decoder into a FieldError (or
// the too-large TypedError).
func strictError(err error) error {
	var big *http.MaxBytesError
	if errors.As(err, &big) {
		return readError(err)
	}
	var syn *jsontext.SyntacticError
	var sem *jsonv2.SemanticError
	switch {
	case errors.As(err, &syn):
		switch {
		case errors.Is(syn.Err, io.ErrUnexpectedEOF):
			return errdefs.InvalidField("body", "truncated JSON")
		case errors.Is(syn.Err, jsontext.ErrDuplicateName):
			return errdefs.InvalidField(fieldOf(syn.JSONPointer), "appears more than once")
		}
		return errdefs.InvalidField("body", "malformed JSON at byte %d: %v", syn.ByteOffset, syn.Err)
	case errors.As(err, &sem):
		field := fieldOf(sem.JSONPointer)
		if errors.Is(sem.Err, jsonv2.ErrUnknownName) {
			return errdefs.InvalidField(field, "unknown field")
		}
		if sem.GoType == nil {
			return errdefs.InvalidField(field, "%v", sem.Err)
		}
		want := typeName(sem.GoType.Kind())
		if sem.GoType == reflect.TypeFor[[]byte]() {
			want = "a base64 string"
		}
		if sem.JSONKind == 0 || sem.JSONKind == '"' && want == "a base64 string" {
			return errdefs.InvalidField(field, "must be %s: %v", want, sem.Err)
		}
		return errdefs.InvalidField(field, "must be %s, not %s", want, kindName(sem.JSONKind))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.InvalidField("body", "truncated JSON")
	}
	return errdefs.InvalidField("body", "%v", err)
}

// fieldOf is the dotted field name a JSON pointer ("/limits/pids") points
// at, without array indexes ("/argv/2" is "argv"); "body" for the root.
func fieldOf(p jsontext.Pointer) string {
	var parts []string
	for tok := range p.Tokens() {
		if _, err := strconv.ParseUint(tok, 10, 64); err == nil && len(parts) > 0 {
			continue // an array index
		}
		parts = append(parts, tok)
	}
	if len(parts) == 0 {
		return "body"
	}
	return strings.Join(parts, ".")
}

// kindName names a JSON kind as a type of value.
func kindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return "invalid JSON"
}

// peerError turns an encoding/json decoding error into a FieldError.
func peerError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var big *http.MaxBytesError
	switch {
	case errors.As(err, &big):
		return readError(err)
	case errors.As(err, &syn):
		return errdefs.InvalidField("body", "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return errdefs.InvalidField(field, "must be %s, not %s", typeName(typ.Type.Kind()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.InvalidField("body", "truncated JSON")
	}
	return errdefs.InvalidField("body", "%v", err)
}

func typeName(kind reflect.Kind) string {
	switch kind {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Bool:
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
// request body read by a streaming decoder, into v, with Decode's rules
// (exact-case names, no unknown or duplicate members, valid UTF-8) and
// errors: a wrong type or an unknown member names field (or field.sub for
// a member inside it).
func DecodeMember(field string, raw []byte, v any) error {
	err := jsonv2.Unmarshal(raw, v, jsonv2.RejectUnknownMembers(true), jsonv2.MatchCaseInsensitiveNames(false),
		jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	if err == nil {
		return nil
	}
	err = strictError(err)
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

// BodyError maps an error reading a request body (larger than its limit,
// truncated) as Decode does.
func BodyError(err error) error { return readError(err) }
