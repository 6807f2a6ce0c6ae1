package route

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/store"
)

// routerPair is two hosts' routers over one real directory (an embedded
// JetStream alone) and one real key store: a, which the tests call, and
// c, the owner of what a forwards. Each host's API is a handler that
// reports what it was given.
type routerPair struct {
	dir     *fleet.Directory
	a, c    *httptest.Server
	ra, rc  *Router
	hosts   []fleet.Host
	key     string
	gotAtC  chan seen
	lastAtA seen
}

// seen is what a host's API handler got.
type seen struct {
	host, path, auth, internal string
	caller                     string
	forwarded                  bool
	bodyBytes                  int64
}

func newRouterPair(t *testing.T) *routerPair {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, err := fleet.Start(ctx, fleet.Options{StoreDir: t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	dir, err := fleet.OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "k1", Name: "t", Tenant: store.DefaultTenant}, "fbx_test-key"); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTenant(ctx, &store.Tenant{Name: "other", Policy: "{}", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "k2", Name: "o", Tenant: "other"}, "fbx_other-key"); err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(ctx, store.APIKey{ID: "k3", Name: "admin", Tenant: store.DefaultTenant, Admin: true}, "fbx_admin-key"); err != nil {
		t.Fatal(err)
	}
	p := &routerPair{dir: dir, key: "fbx_test-key", gotAtC: make(chan seen, 16)}
	api := func(host string, report func(seen)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := io.Copy(io.Discard, r.Body)
			c, fwd := access.ForwardedCaller(w, r)
			report(seen{host: host, path: r.URL.Path, auth: r.Header.Get("Authorization"), internal: r.Header.Get(InternalHeader),
				caller: c.Tenant + "/" + c.KeyID, forwarded: fwd, bodyBytes: n})
			switch {
			case r.Method == "GET" && r.URL.Path == "/v1/sessions":
				fmt.Fprintf(w, `{"sessions":[{"id":"on%s","created_at":"%s"}]}`, host, time.Now().UTC().Format(time.RFC3339Nano))
			case r.Method == "GET" && r.URL.Path == "/sandboxes":
				fmt.Fprintf(w, `[{"sandboxID":"on%s"}]`, host)
			default:
				fmt.Fprintf(w, `{"served_by":%q}`, host)
			}
		})
	}
	key := DeriveKey("a-fleet-secret-of-at-least-32-bytes-long")
	hostList := func(context.Context) ([]fleet.Host, error) { return p.hosts, nil }
	directory := func() (*fleet.Directory, error) { return dir, nil }
	c := New(Options{Self: "c", Local: api("c", func(s seen) { p.gotAtC <- s }), Key: key, Directory: directory, Hosts: hostList, Keys: st, Log: log})
	p.rc = c
	p.c = httptest.NewServer(c)
	t.Cleanup(p.c.Close)
	a := New(Options{Self: "a", Local: api("a", func(s seen) { p.lastAtA = s }), Key: key, Directory: directory, Hosts: hostList, Keys: st, Log: log})
	p.ra = a
	p.a = httptest.NewServer(a)
	t.Cleanup(p.a.Close)
	full := fleet.Capacity{Sessions: 10, MemoryMB: 8192}
	p.hosts = []fleet.Host{
		{ID: "a", API: p.a.URL, Version: "dev", State: fleet.HostReady, Placeable: true, Capacity: full, Load: fleet.Load{Sessions: 9}},
		{ID: "c", API: p.c.URL, Version: "dev", State: fleet.HostReady, Placeable: true, Capacity: full, Load: fleet.Load{Sessions: 1}},
		// d is in the registry but answers nothing.
		{ID: "d", API: "http://127.0.0.1:1", Version: "dev", State: fleet.HostReady, Placeable: true, Capacity: full, Load: fleet.Load{Sessions: 10}},
	}
	return p
}

func (p *routerPair) call(t *testing.T, method, path, key string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.a.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func (p *routerPair) atC(t *testing.T) seen {
	t.Helper()
	select {
	case s := <-p.gotAtC:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("c's API was not called")
		return seen{}
	}
}

func TestRouterForwards(t *testing.T) {
	p := newRouterPair(t)
	ctx := context.Background()
	for _, l := range []fleet.Location{
		{Kind: fleet.KindSession, ID: "sessonc", Host: "c"},
		{Kind: fleet.KindSession, ID: "sessgone", Host: "c", State: fleet.LocationTerminated, Reason: fleet.ReasonHostLost},
		{Kind: fleet.KindSnapshot, ID: "snaponc", Host: "c"},
		{Kind: fleet.KindSnapshot, ID: "replonc", Host: "c", Replicated: true, Digest: "sha256:00"},
	} {
		if err := p.dir.Put(ctx, l); err != nil {
			t.Fatal(err)
		}
	}

	// A session on c: forwarded with the caller, without the key, body
	// streamed whole.
	const size = 8 << 20
	resp, body := p.call(t, "PUT", "/v1/sessions/sessonc/files/big", p.key, io.LimitReader(zeros{}, size), nil)
	if resp.StatusCode != 200 || resp.Header.Get("Forkbox-Host") != "c" || !strings.Contains(body, `"c"`) {
		t.Fatalf("upload to c through a: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	s := p.atC(t)
	if !s.forwarded || s.caller != "default/k1" || s.auth != "" || s.internal != "" || s.bodyBytes != size {
		t.Errorf("c got %+v", s)
	}
	// A fork of c's snapshot goes to c.
	if resp, _ := p.call(t, "POST", "/v1/snapshots/snaponc/fork", p.key, strings.NewReader(`{"count":2}`), nil); resp.Header.Get("Forkbox-Host") != "c" {
		t.Errorf("fork of c's snapshot: %d %v", resp.StatusCode, resp.Header)
	}
	p.atC(t)
	// envd: no key needed at the edge, the token passes to the owner.
	resp, _ = p.call(t, "GET", "/files?path=/etc/hostname", "", nil, map[string]string{"E2b-Sandbox-Id": "sessonc", "X-Access-Token": "tok"})
	if s := p.atC(t); resp.StatusCode != 200 || s.forwarded || s.path != "/files" {
		t.Errorf("envd through a: %d, c got %+v", resp.StatusCode, s)
	}

	// No key, a bad key: refused at a, c never called.
	for _, k := range []string{"", "fbx_wrong"} {
		if resp, body := p.call(t, "GET", "/v1/sessions/sessonc", k, nil, nil); resp.StatusCode != 401 {
			t.Errorf("key %q: %d %s", k, resp.StatusCode, body)
		}
	}
	select {
	case s := <-p.gotAtC:
		t.Errorf("c called for a refused request: %+v", s)
	default:
	}

	// Terminated: 410 with host-lost on forkbox's wire, 404 on E2B's
	// control plane, 502 on envd.
	resp, body = p.call(t, "GET", "/v1/sessions/sessgone", p.key, nil, nil)
	var prob struct{ Type, Detail string }
	_ = json.Unmarshal([]byte(body), &prob)
	if resp.StatusCode != 410 || !strings.HasSuffix(prob.Type, "/session-terminated") || !strings.Contains(prob.Detail, "host-lost") {
		t.Errorf("terminated session: %d %s", resp.StatusCode, body)
	}
	// ... told only to its tenant: without a key 401, another tenant's
	// finds nothing (as on one host), c never called.
	for k, want := range map[string]int{"": 401, "fbx_other-key": 404} {
		for _, path := range []string{"/v1/sessions/sessgone", "/sandboxes/sessgone", "/v1/sessions/sessonc/exec"} {
			if resp, body := p.call(t, "GET", path, k, nil, nil); resp.StatusCode != want || strings.Contains(body, "host-lost") {
				t.Errorf("%s with key %q: %d %s, want %d", path, k, resp.StatusCode, body, want)
			}
		}
	}
	select {
	case s := <-p.gotAtC:
		t.Errorf("c called for another tenant's request: %+v", s)
	default:
	}
	if resp, body := p.call(t, "GET", "/sandboxes/sessgone", p.key, nil, nil); resp.StatusCode != 404 || !strings.Contains(body, `"code":404`) {
		t.Errorf("terminated sandbox (E2B): %d %s", resp.StatusCode, body)
	}
	if resp, body := p.call(t, "GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": "sessgone"}); resp.StatusCode != 502 || strings.Contains(body, "host-lost") || strings.Contains(body, "its host") {
		t.Errorf("terminated sandbox (envd, no key: neither why nor where): %d %s", resp.StatusCode, body)
	}

	// Unknown: served by a.
	if resp, body := p.call(t, "GET", "/v1/sessions/nosuchsession", p.key, nil, nil); resp.StatusCode != 200 || !strings.Contains(body, `"a"`) || p.lastAtA.forwarded {
		t.Errorf("unknown id: %d %s", resp.StatusCode, body)
	}

	// A create: placed on c (the least loaded), body re-sent whole.
	resp, body = p.call(t, "POST", "/v1/sessions", p.key, strings.NewReader(`{"template":"base","memory_mb":64}`), nil)
	if s := p.atC(t); resp.Header.Get("Forkbox-Host") != "c" || !s.forwarded || s.bodyBytes != int64(len(`{"template":"base","memory_mb":64}`)) {
		t.Errorf("create: %d %s, c got %+v", resp.StatusCode, body, s)
	}

	// Lists: a's and c's items, d skipped and named.
	resp, body = p.call(t, "GET", "/v1/sessions", p.key, nil, nil)
	var list struct {
		Sessions []struct{ ID, Host string } `json:"sessions"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list.Sessions) != 2 || resp.Header.Get(SkippedHeader) != "d" {
		t.Fatalf("list: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	for _, s := range list.Sessions {
		if s.ID != "on"+s.Host {
			t.Errorf("list item %+v", s)
		}
	}
	p.atC(t)
	resp, body = p.call(t, "GET", "/sandboxes", p.key, nil, map[string]string{"X-API-Key": p.key})
	if resp.StatusCode != 200 || !strings.Contains(body, `"onc"`) || !strings.Contains(body, `"ona"`) || strings.Contains(body, `"host"`) {
		t.Errorf("E2B list: %d %s", resp.StatusCode, body)
	}
	p.atC(t)
	// E2B pages of one: a's, then c's, then d's (skipped), host by host.
	var pages []string
	for path, n := "/sandboxes?limit=1", 0; path != ""; n++ {
		if n > 4 {
			t.Fatalf("pages do not end: %v", pages)
		}
		resp, body := p.call(t, "GET", path, p.key, nil, nil)
		pages = append(pages, strings.TrimSpace(body)+" skipped="+resp.Header.Get(SkippedHeader))
		path = ""
		if tok := resp.Header.Get("X-Next-Token"); tok != "" {
			path = "/sandboxes?limit=1&nextToken=" + tok
		}
	}
	if want := []string{`[{"sandboxID":"ona"}] skipped=`, `[{"sandboxID":"onc"}] skipped=`, `[] skipped=d`}; strings.Join(pages, "\n") != strings.Join(want, "\n") {
		t.Errorf("E2B pages: %q, want %q", pages, want)
	}
	p.atC(t)

	// A create pinned to c: forwarded there for an admin key only; a
	// host the registry does not have is 400 naming host.
	if resp, body := p.call(t, "POST", "/v1/sessions", "fbx_admin-key", strings.NewReader(`{"host":"c"}`), nil); resp.StatusCode != 200 || resp.Header.Get("Forkbox-Host") != "c" {
		t.Errorf("create pinned to c: %d %s %v", resp.StatusCode, body, resp.Header)
	} else if s := p.atC(t); s.caller != "default/k3" {
		t.Errorf("pinned create reached c as %q", s.caller)
	}
	if resp, body := p.call(t, "POST", "/v1/sessions", p.key, strings.NewReader(`{"host":"c"}`), nil); resp.StatusCode != 403 {
		t.Errorf("create pinned to c with a tenant key: %d %s", resp.StatusCode, body)
	}
	if resp, body := p.call(t, "POST", "/v1/sessions", "fbx_admin-key", strings.NewReader(`{"host":"zz"}`), nil); resp.StatusCode != 400 || !strings.Contains(body, "host") {
		t.Errorf("create pinned to an unknown host: %d %s", resp.StatusCode, body)
	}

	// c lost: its session's calls are 503 with Retry-After (until the
	// fleet marks it terminated), whatever a's cache held.
	p.hosts[1].State = fleet.HostLost
	time.Sleep(1100 * time.Millisecond) // the router's copy of the registry
	if resp, body := p.call(t, "GET", "/v1/sessions/sessonc", p.key, nil, nil); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("session of a lost host: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if resp, body := p.call(t, "GET", "/v1/sessions/sessonc", "", nil, nil); resp.StatusCode != 401 {
		t.Errorf("session of a lost host without a key: %d %s, want 401", resp.StatusCode, body)
	}
	// ... and so are forks of its snapshot that has no copy in the object
	// store, while one with a copy is forked (and created from) here,
	// where it is pulled.
	if resp, body := p.call(t, "POST", "/v1/snapshots/snaponc/fork", p.key, strings.NewReader(`{"count":1}`), nil); resp.StatusCode != 503 {
		t.Errorf("fork of a lost host's unreplicated snapshot: %d %s", resp.StatusCode, body)
	}
	if resp, body := p.call(t, "POST", "/v1/snapshots/replonc/fork", p.key, strings.NewReader(`{"count":1}`), nil); resp.StatusCode != 200 ||
		resp.Header.Get("Forkbox-Host") != "" || p.lastAtA.path != "/v1/snapshots/replonc/fork" {
		t.Errorf("fork of a lost host's replicated snapshot: %d %s %v, a saw %+v", resp.StatusCode, body, resp.Header, p.lastAtA)
	}
	p.lastAtA = seen{}
	if resp, body := p.call(t, "POST", "/v1/sessions", p.key, strings.NewReader(`{"snapshot":"replonc"}`), nil); resp.StatusCode != 200 ||
		resp.Header.Get("Forkbox-Host") != "" || p.lastAtA.path != "/v1/sessions" {
		t.Errorf("create from a lost host's replicated snapshot: %d %s %v, a saw %+v", resp.StatusCode, body, resp.Header, p.lastAtA)
	}
	// c draining: a start from its replicated snapshot is pulled here,
	// one from its snapshot without a copy still goes to c.
	p.hosts[1].State, p.hosts[1].Placeable = fleet.HostDraining, false
	time.Sleep(1100 * time.Millisecond) // the router's copy of the registry
	p.lastAtA = seen{}
	if resp, body := p.call(t, "POST", "/v1/snapshots/replonc/fork", p.key, strings.NewReader(`{"count":1}`), nil); resp.StatusCode != 200 ||
		resp.Header.Get("Forkbox-Host") != "" || p.lastAtA.path != "/v1/snapshots/replonc/fork" {
		t.Errorf("fork of a draining host's replicated snapshot: %d %s %v, a saw %+v", resp.StatusCode, body, resp.Header, p.lastAtA)
	}
	if resp, body := p.call(t, "POST", "/v1/snapshots/snaponc/fork", p.key, strings.NewReader(`{"count":1}`), nil); resp.StatusCode != 200 ||
		resp.Header.Get("Forkbox-Host") != "c" {
		t.Errorf("fork of a draining host's unreplicated snapshot: %d %s %v", resp.StatusCode, body, resp.Header)
	} else if s := p.atC(t); s.path != "/v1/snapshots/snaponc/fork" {
		t.Errorf("c got %+v", s)
	}
	p.hosts[1].State, p.hosts[1].Placeable = fleet.HostReady, true

	// A full fleet: 503 capacity-unavailable with Retry-After.
	for i := range p.hosts {
		p.hosts[i].Load.Sessions = 10
	}
	time.Sleep(1100 * time.Millisecond) // the router's copy of the registry
	resp, body = p.call(t, "POST", "/v1/sessions", p.key, strings.NewReader(`{}`), nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "5" || !strings.Contains(body, "capacity-unavailable") {
		t.Errorf("full fleet: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	// What no host could ever take is this host's to refuse (its 400
	// naming the field), not a 503 to retry.
	for _, b := range []string{`{"isolation":"no-such-tier"}`, `{"memory_mb":1073741824}`, `{"memory_mb":-5}`,
		// Volumes and secrets are this host's.
		`{"volumes":[{"name":"data","path":"/data"}]}`, `{"secrets":["gh"]}`} {
		p.lastAtA = seen{}
		resp, body = p.call(t, "POST", "/v1/sessions", p.key, strings.NewReader(b), nil)
		if resp.StatusCode != 200 || resp.Header.Get("Forkbox-Host") != "" || p.lastAtA.path != "/v1/sessions" {
			t.Errorf("create %s on a full fleet: %d %s, a saw %+v", b, resp.StatusCode, body, p.lastAtA)
		}
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// TestRouterFencesMigrating checks that a session its host is migrating
// is served nothing but its info, whether the call comes to that host
// from a client or forwarded by another (an exec, an envd call: 409,
// the host's API never called), and everything again once the move
// ended; a second migration of it is refused.
func TestRouterFencesMigrating(t *testing.T) {
	p := newRouterPair(t)
	if err := p.dir.Put(context.Background(), fleet.Location{Kind: fleet.KindSession, ID: "sessonc", Host: "c"}); err != nil {
		t.Fatal(err)
	}
	if !p.rc.moving.start("sessonc") {
		t.Fatal("fence start")
	}
	if p.rc.moving.start("sessonc") {
		t.Error("a second migration of one session was let in")
	}
	for _, c := range []struct {
		method, path string
		hdr          map[string]string
		want         int
	}{
		{"POST", "/v1/sessions/sessonc/exec", nil, 409},
		{"GET", "/v1/sessions/sessonc/files/etc/hostname", nil, 409},
		{"POST", "/v1/sessions/sessonc/migrate", nil, 409},
		{"POST", "/sandboxes/sessonc/pause", nil, 409},
		// envd: 502, as E2B's edge answers a sandbox it cannot serve.
		{"GET", "/files?path=/etc/hostname", map[string]string{"E2b-Sandbox-Id": "sessonc", "X-Access-Token": "tok"}, 502},
	} {
		if resp, body := p.call(t, c.method, c.path, p.key, nil, c.hdr); resp.StatusCode != c.want || !strings.Contains(body, "migrating") {
			t.Errorf("%s %s while migrating: %d %s, want %d", c.method, c.path, resp.StatusCode, body, c.want)
		}
	}
	// A client's call straight to c.
	req, _ := http.NewRequest("POST", p.c.URL+"/v1/sessions/sessonc/exec", nil)
	req.Header.Set("Authorization", "Bearer "+p.key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 409 {
		t.Errorf("exec straight to c while migrating: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}
	select {
	case s := <-p.gotAtC:
		t.Errorf("c's API called for a fenced session: %+v", s)
	default:
	}
	if resp, body := p.call(t, "GET", "/v1/sessions/sessonc", p.key, nil, nil); resp.StatusCode != 200 || !strings.Contains(body, `"c"`) {
		t.Errorf("info while migrating: %d %s", resp.StatusCode, body)
	} else if s := p.atC(t); s.path != "/v1/sessions/sessonc" {
		t.Errorf("c got %+v", s)
	}
	p.rc.moving.end("sessonc")
	if resp, body := p.call(t, "POST", "/v1/sessions/sessonc/exec", p.key, nil, nil); resp.StatusCode != 200 {
		t.Errorf("exec after the move ended: %d %s", resp.StatusCode, body)
	} else if s := p.atC(t); s.path != "/v1/sessions/sessonc/exec" {
		t.Errorf("c got %+v", s)
	}
}
