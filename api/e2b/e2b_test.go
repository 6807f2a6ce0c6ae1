package e2b

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// sdkMetadataQuery builds the list query the e2b JS SDK sends for a metadata
// filter: URLSearchParams of the map, encodeURIComponent of that, then the
// query encoding of openapi-fetch.
func sdkMetadataQuery(m map[string]string) url.Values {
	inner := url.Values{}
	for k, v := range m {
		inner.Set(k, v)
	}
	q := url.Values{}
	q.Set("metadata", url.QueryEscape(inner.Encode()))
	// Round-trip through a real URL, as the server receives it.
	u, _ := url.Parse("http://x/v2/sandboxes?" + q.Encode())
	return u.Query()
}

func TestParseMetadataAsTheSDKEncodes(t *testing.T) {
	want := map[string]string{
		"run":      "abc",
		"flavor":   "a b&c=d/é",
		"with=eq":  "100%",
		"plus+key": "+x+",
	}
	q := sdkMetadataQuery(want)
	f, err := listFilter(q)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.Metadata, want) {
		t.Fatalf("metadata = %v, want %v", f.Metadata, want)
	}
}

func TestParseMetadataRefusesGarbage(t *testing.T) {
	for _, v := range []string{"%zz", "novalue", "k=%zz", "%zz=v"} {
		_, err := parseMetadata(v)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "metadata") {
			t.Errorf("parseMetadata(%q) = %v, want an invalid-field error naming metadata", v, err)
		}
	}
}

func TestListFilterDefaultsAndErrors(t *testing.T) {
	f, err := listFilter(url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Limit != maxListLimit || f.Ascending || f.After != nil ||
		!reflect.DeepEqual(f.States, []node.State{node.StateRunning, node.StatePaused}) {
		t.Fatalf("defaults: %+v", f)
	}
	f, err = listFilter(url.Values{"state": {"paused"}, "order": {"asc"}, "limit": {"7"}, "template": {"base"},
		"startedAfter": {"2026-01-02T03:04:05Z"}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.States, []node.State{node.StatePaused}) || !f.Ascending || f.Limit != 7 ||
		f.Template != "base" || !f.CreatedAfter.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Fatalf("parsed: %+v", f)
	}
	for field, q := range map[string]url.Values{
		"state":        {"state": {"running,terminated"}},
		"order":        {"order": {"up"}},
		"limit":        {"limit": {"0"}},
		"startedAfter": {"startedAfter": {"yesterday"}},
		"nextToken":    {"nextToken": {"!!"}},
	} {
		_, err := listFilter(q)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%v: err = %v, want an invalid-field error naming %s", q, err, field)
		}
	}
	if _, err := listFilter(url.Values{"limit": {"101"}}); err == nil {
		t.Error("limit 101 accepted; the maximum is 100")
	}
}

func TestCursorRoundTrip(t *testing.T) {
	c := node.ListCursor{CreatedAt: time.UnixMilli(1764400000123).UTC(), ID: "abc_def"}
	got, err := decodeCursor(encodeCursor(c))
	if err != nil {
		t.Fatal(err)
	}
	if !got.CreatedAt.Equal(c.CreatedAt) || got.ID != c.ID {
		t.Fatalf("round trip: %+v, want %+v", got, c)
	}
	for _, tok := range []string{"", "bm90LWEtY3Vyc29y", "MTIz", "MTIzXw"} { // "", "not-a-cursor", "123", "123_"
		if _, err := decodeCursor(tok); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("decodeCursor(%q) = %v, want ErrInvalid", tok, err)
		}
	}
}

func TestEnvdPublicSurface(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         bool
	}{
		{"GET", "/health", true},
		{"POST", "/health", false},
		{"GET", "/files", true},
		{"POST", "/files", true},
		{"DELETE", "/files", false},
		{"POST", "/process.Process/Start", true},
		{"GET", "/process.Process/Start", false},
		{"POST", "/filesystem.Filesystem/ListDir", true},
		{"POST", "/init", false},
		{"GET", "/envs", true}, // envd's, read by E2B's code-interpreter server
		{"POST", "/envs", false},
		{"GET", "/metrics", false},
		{"POST", "/process.Process/../init", false},
		{"POST", "/process.Process/..", false},
		{"POST", "/filesystem.Filesystem//Stat", false},
		{"POST", "/v1/sessions", false},
	} {
		r := httptest.NewRequest(tc.method, "http://x"+tc.path, nil)
		r.URL.Path = tc.path // keep dot segments as a raw client could send them
		if got := envdPublic(r); got != tc.want {
			t.Errorf("%s %s: public = %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
}

func TestHandles(t *testing.T) {
	for path, want := range map[string]bool{
		"/sandboxes": true, "/sandboxes/x/pause": true, "/v2/sandboxes": true, "/snapshots": true,
		"/templates/abc": true, "/v1/sessions": false, "/sandboxesx": false, "/healthz": false,
	} {
		if got := Handles(httptest.NewRequest("GET", "http://x"+path, nil)); got != want {
			t.Errorf("Handles(%s) = %v, want %v", path, got, want)
		}
	}
	r := httptest.NewRequest("POST", "http://x/process.Process/Start", nil)
	r.Header.Set(SandboxIDHeader, "abc")
	if !Handles(r) {
		t.Error("an envd request (E2b-Sandbox-Id) is not handled")
	}
}

func TestCreateBodyMapping(t *testing.T) {
	parse := func(body string) (newSandbox, error) {
		var b newSandbox
		err := json.Unmarshal([]byte(body), &b)
		return b, err
	}
	b, err := parse(`{"templateID":"base"}`)
	if err != nil {
		t.Fatal(err)
	}
	req, err := b.createSpec()
	if err != nil || req.TimeoutS != 0 || req.OnTimeout != "" {
		t.Fatalf("defaults: %+v %v", req, err)
	}
	b, _ = parse(`{"templateID":"base","timeout":120,"autoPause":true,"autoResume":{"enabled":true},"envVars":{"A":"1"},"metadata":{"m":"v"}}`)
	req, err = b.createSpec()
	if err != nil || req.TimeoutS != 120 || req.OnTimeout != node.OnTimeoutPause || !req.AutoResume ||
		req.Env["A"] != "1" || req.Metadata["m"] != "v" {
		t.Fatalf("mapped: %+v %v", req, err)
	}
	b, _ = parse(`{"network":{"allowOut":["example.com","*.pypi.org","8.8.8.8","2001:db8::1","203.0.113.0/24"],"denyOut":["0.0.0.0/0"]}}`)
	req, err = b.createSpec()
	want := []string{"example.com:80", "example.com:443", "*.pypi.org:80", "*.pypi.org:443", "8.8.8.8/32",
		"2001:db8::1/128", "203.0.113.0/24"}
	if err != nil || req.Network == nil || !reflect.DeepEqual(req.Network.Allow, want) {
		t.Fatalf("allowOut mapping: %+v %v, want %v", req.Network, err, want)
	}
	b, _ = parse(`{"volumeMounts":[{"name":"data","path":"/home/user/data"}]}`)
	if req, err = b.createSpec(); err != nil || len(req.Volumes) != 1 || req.Volumes[0] != (node.VolumeMount{Name: "data", Path: "/home/user/data"}) {
		t.Fatalf("volumeMounts mapping: %+v %v", req.Volumes, err)
	}
	for field, body := range map[string]string{
		"timeout":      `{"timeout":0}`,
		"autoResume":   `{"autoResume":{"enabled":true}}`,
		"mcp":          `{"mcp":{"x":{}}}`,
		"volumeMounts": `{"volumeMounts":[{"name":"v","path":"/data"}]}`,
		"network":      `{"network":{"rules":{"example.com":[]}}}`,
	} {
		b, err := parse(body)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.createSpec()
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v, want an invalid-field error naming %s", body, err, field)
		}
	}
}
