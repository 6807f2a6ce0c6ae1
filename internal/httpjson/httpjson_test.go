package httpjson

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// decodeTarget stands for a request body type.
type decodeTarget struct {
	Template string            `json:"template"`
	MemoryMB int64             `json:"memory_mb"`
	CPU      float64           `json:"cpu"`
	Env      map[string]string `json:"env"`
	Args     []string          `json:"args"`
	Stdin    bool              `json:"stdin"`
	Limits   struct {
		Pids int64 `json:"pids"`
	} `json:"limits"`
}

// decode runs Decode on body.
func decode(body string, limit int64, allowEmpty bool) (decodeTarget, error) {
	var v decodeTarget
	r := httptest.NewRequest("POST", "/v1/sessions", strings.NewReader(body))
	return v, Decode(r, &v, limit, Options{AllowEmpty: allowEmpty})
}

// wantField fails t unless err is a *FieldError (hence invalid argument)
// for field whose reason contains reason.
func wantField(t *testing.T, body string, err error, field, reason string) {
	t.Helper()
	var fe *errdefs.FieldError
	if !errors.As(err, &fe) || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("%.40q: err = %v, want a field error", body, err)
	}
	if fe.Field != field || !strings.Contains(fe.Reason, reason) {
		t.Fatalf("%.40q: field error %q: %q, want %q: ...%s...", body, fe.Field, fe.Reason, field, reason)
	}
}

// TestDecodeJSONValid proves a well-formed body decodes, with surrounding
// whitespace allowed.
func TestDecodeJSONValid(t *testing.T) {
	v, err := decode(" \n{\"template\":\"base\",\"memory_mb\":512,\"env\":{\"A\":\"b\"},\"limits\":{\"pids\":9}}\n\t", testLimit, false)
	if err != nil {
		t.Fatal(err)
	}
	if v.Template != "base" || v.MemoryMB != 512 || v.Env["A"] != "b" || v.Limits.Pids != 9 {
		t.Fatalf("decoded %+v", v)
	}
}

// TestDecodeJSONFieldErrors proves each kind of bad body is a field error
// naming the field at fault, or "body" when none applies.
func TestDecodeJSONFieldErrors(t *testing.T) {
	for _, c := range []struct {
		body, field, reason string
	}{
		{`{"template":"x","bogus":1}`, "bogus", "unknown field"},
		{`{"memory_mb":"x"}`, "memory_mb", "must be an integer, not a string"},
		{`{"memory_mb":1.5}`, "memory_mb", "must be an integer"},
		{`{"cpu":true}`, "cpu", "must be a number"},
		{`{"template":7}`, "template", "must be a string"},
		{`{"env":[]}`, "env", "must be an object"},
		{`{"env":{"A":1}}`, "env.A", "must be a string"},
		{`{"args":["ls",2]}`, "args", "must be a string"},
		{`{"args":"ls"}`, "args", "must be an array"},
		{`{"stdin":"yes"}`, "stdin", "must be true or false"},
		{`{"limits":{"pids":"many"}}`, "limits.pids", "must be an integer"},
		{`[]`, "body", "must be an object"},
		{`"text"`, "body", "must be an object"},
		{`null`, "body", "is null"},
		{` null `, "body", "is null"},
		{`7`, "body", "must be an object"},
		{`{"CPU":2}`, "CPU", "unknown field"},
		{`{"Template":"base"}`, "Template", "unknown field"},
		{`{"limits":{"PIDS":3}}`, "limits.PIDS", "unknown field"},
		{`{"cpu":1,"cpu":2}`, "cpu", "more than once"},
		{"{\"template\":\"\xff\"}", "body", "malformed JSON"},
		{`{"template":`, "body", "truncated"},
		{`{"template" "x"}`, "body", "malformed JSON"},
		{`{'template':1}`, "body", "malformed JSON"},
		{`not json`, "body", "malformed JSON"},
		{`{} {}`, "body", "data after"},
		{`{}x`, "body", "data after"},
		{`{}}`, "body", "data after"},
		{`{} []`, "body", "data after"},
	} {
		_, err := decode(c.body, testLimit, true)
		wantField(t, c.body, err, c.field, c.reason)
	}
}

// TestDecodeJSONEmptyBody proves an empty (or all-whitespace) body is {}
// where allowed and a "body" field error where not.
func TestDecodeJSONEmptyBody(t *testing.T) {
	for _, body := range []string{"", " \n\t "} {
		v, err := decode(body, testLimit, true)
		if err != nil || v.Template != "" {
			t.Fatalf("%q allowed empty: %+v, %v", body, v, err)
		}
		_, err = decode(body, testLimit, false)
		wantField(t, body, err, "body", "empty")
	}
}

// TestDecodeJSONOversized proves a body beyond the limit is a
// content-too-large problem naming "body" (HTTP 413 at the edge), whether
// the excess is inside the object or after it.
func TestDecodeJSONOversized(t *testing.T) {
	big := `{"template":"` + strings.Repeat("a", 100) + `"}`
	_, err := decode(big, 64, false)
	wantTyped(t, err, ProblemContentTooLarge, "body", "larger than 64 bytes")

	if _, err := decode(big, int64(len(big)), false); err != nil {
		t.Fatalf("a body of exactly the limit: %v", err)
	}
	padded := `{}` + strings.Repeat(" ", 100)
	_, err = decode(padded, 64, false)
	wantTyped(t, err, ProblemContentTooLarge, "body", "larger than 64 bytes")
	spaces := strings.Repeat(" ", 100) + `{}`
	_, err = decode(spaces, 64, false)
	wantTyped(t, err, ProblemContentTooLarge, "body", "larger than 64 bytes")
}

// wantTyped fails t unless err is an invalid-argument TypedError of
// problem type typ for field whose message contains msg.
func wantTyped(t *testing.T, err error, typ, field, msg string) {
	t.Helper()
	var te *errdefs.TypedError
	if !errors.As(err, &te) || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("err = %v, want a %s problem", err, typ)
	}
	if te.Type != typ || te.Field != field || !strings.Contains(te.Msg, msg) {
		t.Fatalf("problem %s field %q: %q, want %s field %q: ...%s...", te.Type, te.Field, te.Msg, typ, field, msg)
	}
}

// TestDecodeJSONMediaType proves JSON bodies are read with no
// Content-Type, application/json with parameters and +json types, and
// refused (unsupported-media-type, naming Content-Type) with any other
// type, such as the form type `curl -d` sends.
func TestDecodeJSONMediaType(t *testing.T) {
	for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8",
		"application/merge-patch+json", "application/vnd.forkbox.v1+json"} {
		r := httptest.NewRequest("POST", "/v1/sessions", strings.NewReader(`{"template":"base"}`))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		var v decodeTarget
		if err := Decode(r, &v, testLimit, Options{}); err != nil || v.Template != "base" {
			t.Errorf("Content-Type %q: %+v, %v", ct, v, err)
		}
	}
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain", "text/json", "multipart/form-data; boundary=x",
		"application/json; charset=latin1", "application/jsonx", "garbage;;", "application/octet-stream"} {
		r := httptest.NewRequest("POST", "/v1/sessions", strings.NewReader(`{"template":"base"}`))
		r.Header.Set("Content-Type", ct)
		var v decodeTarget
		wantTyped(t, Decode(r, &v, testLimit, Options{}), ProblemUnsupportedMediaType, "Content-Type", "")
	}
	// An empty body has no media type to check.
	r := httptest.NewRequest("POST", "/v1/sessions", strings.NewReader(""))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	var v decodeTarget
	if err := Decode(r, &v, testLimit, Options{AllowEmpty: true}); err != nil {
		t.Errorf("empty form body where empty is allowed: %v", err)
	}
}

// TestDecodePeer proves a peer's format decodes as Go's encoding/json
// does (E2B's own server): names match in any case, unknown members and
// any Content-Type are accepted, null is {}; too large is still refused.
func TestDecodePeer(t *testing.T) {
	for _, body := range []string{`{"TEMPLATE":"base","extra":1}`, `{"template":"base"}`} {
		r := httptest.NewRequest("POST", "/sandboxes", strings.NewReader(body))
		r.Header.Set("Content-Type", "text/plain")
		var v decodeTarget
		if err := Decode(r, &v, testLimit, Options{Peer: true}); err != nil || v.Template != "base" {
			t.Errorf("%s: %+v, %v", body, v, err)
		}
	}
	var v decodeTarget
	if err := Decode(httptest.NewRequest("POST", "/sandboxes", strings.NewReader("null")), &v, testLimit, Options{Peer: true}); err != nil {
		t.Errorf("null: %v", err)
	}
	r := httptest.NewRequest("POST", "/sandboxes", strings.NewReader(`{"template":"`+strings.Repeat("a", 100)+`"}`))
	wantTyped(t, Decode(r, &v, 64, Options{Peer: true}), ProblemContentTooLarge, "body", "larger than 64")
	r = httptest.NewRequest("POST", "/sandboxes", strings.NewReader(`{"memory_mb":"x"}`))
	wantField(t, "peer", Decode(r, &v, testLimit, Options{Peer: true}), "memory_mb", "must be an integer")
}

// testLimit is the body limit of these tests, in bytes.
const testLimit = 1 << 20
