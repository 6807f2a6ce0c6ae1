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
		{`{"memory_mb":"x"}`, "memory_mb", "must be an integer, not string"},
		{`{"memory_mb":1.5}`, "memory_mb", "must be an integer"},
		{`{"cpu":true}`, "cpu", "must be a number"},
		{`{"template":7}`, "template", "must be a string"},
		{`{"env":[]}`, "env", "must be an object"},
		{`{"env":{"A":1}}`, "env", "must be a string"},
		{`{"args":"ls"}`, "args", "must be an array"},
		{`{"stdin":"yes"}`, "stdin", "must be true or false"},
		{`{"limits":{"pids":"many"}}`, "limits.pids", "must be an integer"},
		{`[]`, "body", "must be an object"},
		{`"text"`, "body", "must be an object"},
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

// TestDecodeJSONOversized proves a body beyond the limit is a "body" field
// error, whether the excess is inside the object or after it.
func TestDecodeJSONOversized(t *testing.T) {
	big := `{"template":"` + strings.Repeat("a", 100) + `"}`
	_, err := decode(big, 64, false)
	wantField(t, big, err, "body", "larger than 64 bytes")

	if _, err := decode(big, int64(len(big)), false); err != nil {
		t.Fatalf("a body of exactly the limit: %v", err)
	}
	padded := `{}` + strings.Repeat(" ", 100)
	_, err = decode(padded, 64, false)
	wantField(t, padded, err, "body", "larger than 64 bytes")
}

// testLimit is the body limit of these tests, in bytes.
const testLimit = 1 << 20
