package client

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
)

// TestNotFoundMessage proves a not-found problem that only names the
// thing reads "... not found", and that other problems keep their status.
func TestNotFoundMessage(t *testing.T) {
	for _, c := range []struct {
		p    v1.Problem
		want string
	}{
		{v1.Problem{Type: "/problems/not-found", Status: 404, Detail: `session "x"`}, `session "x" not found`},
		{v1.Problem{Type: "/problems/not-found", Status: 404, Detail: `template "t" does not exist`}, `template "t" does not exist`},
		{v1.Problem{Type: "about:blank", Status: 404, Detail: "404 page not found"}, "404 page not found (HTTP 404)"},
		{v1.Problem{Type: "/problems/conflict", Status: 409, Detail: "session x is paused"}, "session x is paused (HTTP 409)"},
	} {
		e := &Error{Problem: c.p}
		if e.Error() != c.want {
			t.Errorf("%+v: %q, want %q", c.p, e.Error(), c.want)
		}
	}
}

// TestOpenSettings proves Open takes the URL and key from its options
// before the environment, reads a local daemon's key file only when no
// key is given, names the key's source in a refused key's message, and
// refuses a URL that is not http(s)://HOST.
func TestOpenSettings(t *testing.T) {
	t.Setenv(EnvURL, "http://127.0.0.1:1")
	t.Setenv(EnvAPIKey, "from-env")
	c, err := Open(Options{URL: "http://127.0.0.1:2", URLSource: "the --url flag"})
	if err != nil || c.BaseURL() != "http://127.0.0.1:2" || c.apiKey != "from-env" || c.keySource != EnvAPIKey {
		t.Fatalf("Open with a URL: %+v, %v", c, err)
	}
	c, _ = Open(Options{APIKey: "flag", KeySource: "the --api-key flag"})
	if c.BaseURL() != "http://127.0.0.1:1" || c.apiKey != "flag" {
		t.Fatalf("Open with a key: %+v", c)
	}
	ke := &KeyError{Source: c.keySource, Err: &Error{Problem: v1.Problem{Status: 401, Detail: "invalid API key"}}}
	if !strings.Contains(ke.Error(), "read from the --api-key flag") || !errors.Is(ke, errdefs.ErrUnauthenticated) {
		t.Errorf("key error %q", ke.Error())
	}
	t.Setenv(EnvAPIKey, "")
	file := filepath.Join(t.TempDir(), "api-key")
	os.WriteFile(file, []byte("from-file\n"), 0o600)
	c, err = Open(Options{KeyFile: file})
	if err != nil || c.apiKey != "from-file" || c.keySource != "the key file "+file {
		t.Fatalf("Open with a key file: %+v, %v", c, err)
	}
	if _, err := Open(Options{URL: "http://192.0.2.1:7070"}); err == nil || !strings.Contains(err.Error(), "not local") {
		t.Errorf("Open of a remote daemon without a key: %v", err)
	}
	if _, err := Open(Options{URL: "127.0.0.1:7070", URLSource: "the --url flag", APIKey: "k"}); err == nil ||
		!strings.Contains(err.Error(), `the --url flag: "127.0.0.1:7070" is not a daemon URL`) {
		t.Errorf("Open of a URL without a scheme: %v", err)
	}
}

// TestUnreachable proves a refused connection is an UnreachableError of
// class unavailable naming the daemon's URL.
func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	_, err = New(url, "k", nil).ListSessions(t.Context(), ListOptions{})
	var ue *UnreachableError
	if !errors.As(err, &ue) || !errors.Is(err, errdefs.ErrUnavailable) ||
		!strings.HasPrefix(err.Error(), "cannot reach the forkbox daemon at "+url+": is `forkbox serve` running? (") {
		t.Fatalf("call to a closed port: %v", err)
	}
}

// TestFileQueryAndSource proves a relative sandbox path is sent with
// relative=true and a local path's source label is its base name.
func TestFileQueryAndSource(t *testing.T) {
	if q := fileQuery("a/b.txt", ""); q.Get("relative") != "true" {
		t.Errorf("relative path query %v", q)
	}
	if q := fileQuery("/a/b.txt", "root"); q.Get("relative") != "" || q.Get("user") != "root" {
		t.Errorf("absolute path query %v", q)
	}
	for in, want := range map[string]string{"/home/me/img.tar": "img.tar", "./oci/": "oci", "/": "", "a\x01b": "ab"} {
		if got := sourceLabel(in); got != want {
			t.Errorf("sourceLabel(%q) = %q, want %q", in, got, want)
		}
	}
}
