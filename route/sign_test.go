package route

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/tenancy"
)

func peers(ids ...string) func(string) bool {
	return func(id string) bool {
		for _, p := range ids {
			if p == id {
				return true
			}
		}
		return false
	}
}

func TestSignVerify(t *testing.T) {
	key := DeriveKey("a-fleet-secret-of-at-least-32-bytes-long")
	a := NewSigner(key, "a", peers("b", "c"))
	b := NewSigner(key, "b", peers("a", "c"))
	caller := tenancy.Caller{Tenant: "acme", KeyID: "k1", Admin: true}
	h := http.Header{}
	a.Sign(h, "b", "POST", "/v1/sessions/x/exec?wait=1", caller, true)
	id, err := b.Verify(h.Get(InternalHeader), "POST", "/v1/sessions/x/exec?wait=1")
	if err != nil {
		t.Fatal(err)
	}
	if id.Host != "a" || !id.Authenticated || id.Caller.Tenant != "acme" || id.Caller.KeyID != "k1" || !id.Caller.Admin {
		t.Fatalf("identity %+v", id)
	}
	// The same header again is a replay.
	if _, err := b.Verify(h.Get(InternalHeader), "POST", "/v1/sessions/x/exec?wait=1"); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "replayed") {
		t.Errorf("replay: %v", err)
	}

	// The same header taken to another host of the fleet (which has not
	// seen its nonce) is refused there: it names its receiver.
	c := NewSigner(key, "c", peers("a", "b"))
	h2 := http.Header{}
	a.Sign(h2, "b", "POST", "/v1/sessions", caller, true)
	if _, err := c.Verify(h2.Get(InternalHeader), "POST", "/v1/sessions"); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "signed for host") {
		t.Errorf("a header for b replayed at c: %v", err)
	}
	if _, err := b.Verify(strings.Replace(h2.Get(InternalHeader), "to=b", "to=c", 1), "POST", "/v1/sessions"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("receiver changed: %v", err)
	}

	fresh := func(c tenancy.Caller, auth bool) string {
		h := http.Header{}
		a.Sign(h, "b", "GET", "/v1/sessions/x", c, auth)
		return h.Get(InternalHeader)
	}
	// No caller: an envd request.
	if id, err := b.Verify(fresh(tenancy.Caller{}, false), "GET", "/v1/sessions/x"); err != nil || id.Authenticated {
		t.Errorf("envd signature: %+v %v", id, err)
	}
	for name, tc := range map[string]struct {
		value, method, uri, want string
	}{
		"other path":   {fresh(caller, true), "GET", "/v1/sessions/y", "bad signature"},
		"other method": {fresh(caller, true), "DELETE", "/v1/sessions/x", "bad signature"},
		"other query":  {fresh(caller, true), "GET", "/v1/sessions/x?a=1", "bad signature"},
		"tenant changed": {strings.Replace(fresh(caller, true), "tenant=acme", "tenant=evil", 1), "GET", "/v1/sessions/x",
			"bad signature"},
		"admin raised": {strings.Replace(fresh(tenancy.Caller{Tenant: "acme"}, true), "admin=0", "admin=1", 1), "GET",
			"/v1/sessions/x", "bad signature"},
		"garbage":   {"%zz", "GET", "/v1/sessions/x", "malformed"},
		"unsigned":  {"v=1&host=a&ts=1&nonce=ab&auth=1&tenant=acme", "GET", "/v1/sessions/x", "malformed"},
		"other key": {signedBy(NewSigner(DeriveKey("another-secret-another-secret-another"), "a", peers("b"))), "GET", "/v1/sessions/x", "bad signature"},
	} {
		if _, err := b.Verify(tc.value, tc.method, tc.uri); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}

	// Skew: a header from 31 s ago or 31 s ahead is refused; 20 s is fine.
	for _, d := range []time.Duration{-31 * time.Second, 31 * time.Second} {
		old := NewSigner(key, "a", peers("b"))
		old.now = func() time.Time { return time.Now().Add(d) }
		if _, err := b.Verify(signedBy(old), "GET", "/v1/sessions/x"); err == nil || !strings.Contains(err.Error(), "timestamp") {
			t.Errorf("skew %v: %v", d, err)
		}
	}
	near := NewSigner(key, "a", peers("b"))
	near.now = func() time.Time { return time.Now().Add(-20 * time.Second) }
	if _, err := b.Verify(signedBy(near), "GET", "/v1/sessions/x"); err != nil {
		t.Errorf("skew 20 s: %v", err)
	}

	// A sender outside the registry, and one claiming to be the receiver.
	d := NewSigner(key, "d", peers("b"))
	if _, err := b.Verify(signedBy(d), "GET", "/v1/sessions/x"); err == nil || !strings.Contains(err.Error(), "registry") {
		t.Errorf("unknown peer: %v", err)
	}
	self := NewSigner(key, "b", peers("b"))
	if _, err := b.Verify(signedBy(self), "GET", "/v1/sessions/x"); err == nil || !strings.Contains(err.Error(), "registry") {
		t.Errorf("self as sender: %v", err)
	}
}

func signedBy(s *Signer) string {
	h := http.Header{}
	s.Sign(h, "b", "GET", "/v1/sessions/x", tenancy.Caller{Tenant: "acme"}, true)
	return h.Get(InternalHeader)
}

// TestRouterForgedHeader: a client's own Forkbox-Internal header is
// refused (401, the API never sees it), a valid one from a peer reaches
// the API with its caller, and a client request reaches it with no
// forwarded caller and without the header.
func TestRouterForgedHeader(t *testing.T) {
	key := DeriveKey("a-fleet-secret-of-at-least-32-bytes-long")
	var got struct {
		called    bool
		caller    tenancy.Caller
		forwarded bool
		header    string
	}
	local := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.called = true
		got.caller, got.forwarded = access.ForwardedCaller(w, r)
		got.header = r.Header.Get(InternalHeader)
	})
	hosts := func(ctx context.Context) ([]fleet.Host, error) {
		return []fleet.Host{{ID: "a", Placeable: true}, {ID: "b", Placeable: true}}, nil
	}
	rt := New(Options{Self: "b", Local: local, Key: key, Hosts: hosts,
		Directory: func() (*fleet.Directory, error) { return nil, errdefs.Newf(errdefs.ErrUnavailable, "none") }})

	send := func(header string) *httptest.ResponseRecorder {
		got.called, got.forwarded = false, false
		r := httptest.NewRequest("GET", "/v1/info", nil)
		if header != "" {
			r.Header.Set(InternalHeader, header)
		}
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, r)
		return w
	}
	forged := url.Values{"v": {"1"}, "host": {"a"}, "ts": {"0"}, "nonce": {"00"}, "auth": {"1"}, "tenant": {"default"},
		"admin": {"1"}, "sig": {strings.Repeat("0", 64)}}.Encode()
	if w := send(forged); w.Code != http.StatusUnauthorized || got.called {
		t.Errorf("forged header: %d, API called %v", w.Code, got.called)
	}
	a := NewSigner(key, "a", peers("b"))
	h := http.Header{}
	a.Sign(h, "b", "GET", "/v1/info", tenancy.Caller{Tenant: "acme", KeyID: "k"}, true)
	if w := send(h.Get(InternalHeader)); w.Code != http.StatusOK || !got.forwarded || got.caller.Tenant != "acme" || got.header != "" {
		t.Errorf("signed by a: %d forwarded %v caller %+v header %q", w.Code, got.forwarded, got.caller, got.header)
	}
	if w := send(""); w.Code != http.StatusOK || !got.called || got.forwarded {
		t.Errorf("plain request: %d called %v forwarded %v", w.Code, got.called, got.forwarded)
	}
}
