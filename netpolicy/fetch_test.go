package netpolicy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestFetch serves a file on loopback and fetches it through a Fetcher
// whose blocklist lets loopback through (a test's: the real one never
// does): allowed by name and by address, refused when the allow-list
// is empty or does not name the host, when a redirect leaves it, past
// the size bound, and on loopback by the real blocklist.
func TestFetch(t *testing.T) {
	body := strings.Repeat("forkbox ", 512)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/file":
			fmt.Fprint(w, body)
		case "/away":
			http.Redirect(w, r, "http://elsewhere.test:"+r.Host[strings.LastIndex(r.Host, ":")+1:]+"/file", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	port := u.Port()
	lo := netip.MustParseAddr("127.0.0.1")
	f := NewFetcher(&Blocklist{}, MapResolver{"files.test": {lo}, "elsewhere.test": {lo}})
	ctx := context.Background()
	get := func(raw string, allow []string, max int64) (string, error) {
		var b bytes.Buffer
		_, err := f.Fetch(ctx, raw, allow, max, &b)
		return b.String(), err
	}
	for _, tc := range []struct {
		doc, url string
		allow    []string
		max      int64
		want     error
		detail   string
	}{
		{doc: "by name", url: "http://files.test:" + port + "/file", allow: []string{"files.test:" + port}, max: 1 << 20},
		{doc: "by address", url: srv.URL + "/file", allow: []string{"127.0.0.1/32"}, max: 1 << 20},
		{doc: "no allow-list", url: "http://files.test:" + port + "/file", max: 1 << 20, want: errdefs.ErrInvalidArgument, detail: "no egress allow-list"},
		{doc: "another host", url: "http://files.test:" + port + "/file", allow: []string{"other.test:" + port}, max: 1 << 20,
			want: errdefs.ErrInvalidArgument, detail: "files.test port " + port + " is not in the allow-list"},
		{doc: "a redirect out of the list", url: "http://files.test:" + port + "/away", allow: []string{"files.test:" + port}, max: 1 << 20,
			want: errdefs.ErrInvalidArgument, detail: "elsewhere.test port " + port + " is not in the allow-list"},
		{doc: "too long", url: srv.URL + "/file", allow: []string{"127.0.0.1/32"}, max: 100, want: errdefs.ErrResourceExhausted},
		{doc: "not found", url: srv.URL + "/nothing", allow: []string{"127.0.0.1/32"}, max: 100, want: errdefs.ErrInvalidArgument, detail: "404"},
		{doc: "not http", url: "ftp://files.test/file", allow: []string{"files.test:21"}, max: 100, want: errdefs.ErrInvalidArgument},
	} {
		got, err := get(tc.url, tc.allow, tc.max)
		if tc.want == nil {
			if err != nil || got != body {
				t.Errorf("%s: %d bytes, %v; want the file", tc.doc, len(got), err)
			}
			continue
		}
		if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.detail) {
			t.Errorf("%s: %v; want %v naming %q", tc.doc, err, tc.want, tc.detail)
		}
	}
	real := NewFetcher(NewBlocklist(nil), nil)
	if _, err := real.Fetch(ctx, srv.URL+"/file", []string{"127.0.0.1/32"}, 1<<20, &bytes.Buffer{}); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "always blocked") {
		t.Errorf("loopback through the real blocklist: %v; want always blocked", err)
	}
}
