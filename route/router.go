// Package route puts the hosts of a fleet behind any host's API: a
// request naming a session or snapshot another host holds is proxied to
// that host (the fleet's directory says which), a create is placed on the
// host that fits it best (the host registry), and lists answer the
// fleet's. The caller's API key is checked once, at the host the client
// called (the edge); the forwarded request carries the caller in a header
// signed with a key derived from the fleet secret (sign.go), which the
// serving host verifies instead of a key. It also keeps the directory's
// entries of this host's sessions and snapshots (Tracked, directory.go).
package route

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/api/e2b"
	"github.com/forkbox/forkbox/api/portproxy"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// Keys authenticates API keys (store.Store).
type Keys interface {
	AuthenticateKey(ctx context.Context, secret string) (*store.APIKey, error)
}

// Options configure a Router.
type Options struct {
	// Self is this host's fleet id.
	Self string
	// Local serves what this host holds (api.Server).
	Local http.Handler
	// Key signs forwarded requests and verifies those of peers
	// (DeriveKey of the fleet secret).
	Key []byte
	// Directory returns the fleet's directory (ErrUnavailable while a
	// cluster has no quorum: requests are then served locally).
	Directory func() (*fleet.Directory, error)
	// Hosts lists the host registry (fleet.Registry.List).
	Hosts func(ctx context.Context) ([]fleet.Host, error)
	// Holds reports whether this host holds kind's id live (a session
	// not terminated, a snapshot): such a request is served here without
	// reading the directory. nil: the directory is always read.
	Holds func(ctx context.Context, kind fleet.Kind, id string) bool
	// Keys authenticates the caller's key at the edge.
	Keys Keys
	// Domain is forkbox serve --domain (PORT-ID.DOMAIN host names).
	Domain string
	Log    *slog.Logger
}

// Router is the http.Handler in front of the host's API. Build it with
// New.
type Router struct {
	o         Options
	signer    *Signer
	hosts     hostCache
	placed    placements
	idem      idempotent
	locs      locationCache
	moving    fence
	transport *http.Transport
}

// New returns the router of o.
func New(o Options) *Router {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	rt := &Router{o: o, hosts: hostCache{list: o.Hosts}}
	rt.signer = NewSigner(o.Key, o.Self, rt.Known)
	rt.transport = &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // an exec's first byte may take as long as its command
		ExpectContinueTimeout: time.Second,
	}
	return rt
}

// Known reports whether id is a host of the registry (as last read, at
// most a second ago); the Signer's sender check.
func (rt *Router) Known(id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	hs, err := rt.hosts.get(ctx)
	if err != nil {
		return false
	}
	for _, h := range hs {
		if h.ID == id {
			return true
		}
	}
	return false
}

// target is what a request names.
type target struct {
	kind fleet.Kind // "" names nothing located
	id   string
	// e2b: the request is on E2B's wire (errors in E2B's JSON).
	e2b bool
	// caller: the edge authenticates the caller's key and forwards the
	// caller; false for envd and port requests, which carry the
	// sandbox's own tokens the owner checks.
	caller bool
}

// classify returns what r names: a session or snapshot by id, a create
// (POST /v1/sessions, E2B POST /sandboxes and /v2/sandboxes) or a list.
func (rt *Router) classify(r *http.Request) (t target, create, list bool) {
	if _, id, ok := portproxy.ParseHost(r.Host, rt.o.Domain); ok {
		return target{kind: fleet.KindSession, id: id, e2b: true}, false, false
	}
	if id := r.Header.Get(e2b.SandboxIDHeader); id != "" {
		return target{kind: fleet.KindSession, id: id, e2b: true}, false, false
	}
	p := r.URL.Path
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	switch {
	case len(segs) >= 3 && segs[0] == "v1" && segs[1] == "sessions" && segs[2] != "":
		return target{kind: fleet.KindSession, id: segs[2], caller: true}, false, false
	case len(segs) >= 3 && segs[0] == "v1" && segs[1] == "snapshots" && segs[2] != "":
		return target{kind: fleet.KindSnapshot, id: segs[2], caller: true}, false, false
	case len(segs) >= 2 && segs[0] == "sandboxes" && segs[1] != "":
		return target{kind: fleet.KindSession, id: segs[1], e2b: true, caller: true}, false, false
	case len(segs) >= 3 && segs[0] == "v2" && segs[1] == "sandboxes" && segs[2] != "":
		return target{kind: fleet.KindSession, id: segs[2], e2b: true, caller: true}, false, false
	case len(segs) == 2 && segs[0] == "templates" && r.Method == http.MethodDelete:
		// E2B deletes a snapshot as a template; a template name is in no
		// directory entry and stays local.
		return target{kind: fleet.KindSnapshot, id: segs[1], e2b: true, caller: true}, false, false
	}
	isE2B := !strings.HasPrefix(p, "/v1/")
	switch {
	case r.Method == http.MethodPost && (p == "/v1/sessions" || p == "/sandboxes" || p == "/v2/sandboxes"):
		return target{e2b: isE2B, caller: true}, true, false
	case r.Method == http.MethodGet && (p == "/v1/sessions" || p == "/v1/snapshots" || p == "/sandboxes" || p == "/v2/sandboxes" || p == "/snapshots"):
		return target{e2b: isE2B, caller: true}, false, true
	}
	return target{}, false, false
}

// infoCall reports whether r, which names session t, only reads its
// record (REST GET /v1/sessions/{id}, E2B GET /sandboxes/{id}): what a
// migrating session still answers.
func infoCall(r *http.Request, t target) bool {
	if r.Method != http.MethodGet || !t.caller {
		return false
	}
	p := r.URL.Path
	return p == "/v1/sessions/"+t.id || p == "/sandboxes/"+t.id
}

// ServeHTTP routes r: a request a peer signed is verified and served
// here (never forwarded again); a client's is served here or forwarded
// to the host that holds what it names, placed (creates) or fanned out
// (lists).
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(access.RequestIDHeader) == "" {
		r.Header.Set(access.RequestIDHeader, newRequestID())
	}
	t, create, list := rt.classify(r)
	if t.kind == fleet.KindSession && rt.moving.has(t.id) && !infoCall(r, t) {
		// Fenced: a call now could resume the paused source (an
		// auto-resume) or change it after its snapshot, which the
		// moved copy would not have.
		rt.fail(w, r, t, errdefs.Newf(errdefs.ErrConflict,
			"session %s is migrating to another host (where it gets a new id): only its info is served until the move ends", t.id))
		return
	}
	if v := r.Header.Get(InternalHeader); v != "" || len(r.Header.Values(InternalHeader)) > 0 {
		id, err := rt.signer.Verify(v, r.Method, r.RequestURI)
		r.Header.Del(InternalHeader)
		if err != nil {
			rt.o.Log.Warn("fleet: forwarded request refused", "method", r.Method, "path", r.URL.Path,
				"remote", r.RemoteAddr, "err", err)
			rt.fail(w, r, t, err)
			return
		}
		ctx := r.Context()
		if id.Authenticated {
			ctx = access.WithForwarded(ctx, id.Caller)
		}
		rt.o.Local.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	switch {
	case t.kind != "":
		rt.serveLocated(w, r, t)
	case create:
		rt.serveCreate(w, r, t)
	case list:
		rt.serveList(w, r, t)
	default:
		rt.o.Local.ServeHTTP(w, r)
	}
}

// serveLocated serves a request naming a session or snapshot: here when
// this host holds it (Options.Holds, else its directory entry says so)
// or the directory has no entry (the local API
// answers 404 as before), forwarded to its host otherwise; a session
// the fleet gave up on is 410 session-terminated (E2B: 404, as for a
// killed sandbox).
func (rt *Router) serveLocated(w http.ResponseWriter, r *http.Request, t target) {
	if rt.o.Holds != nil && rt.o.Holds(r.Context(), t.kind, t.id) {
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	loc, ok := rt.locs.get(t.kind, t.id)
	if ok {
		if _, err := rt.host(r.Context(), loc.Host); err != nil {
			ok = false // its host went away: read the entry again
		}
	}
	var lerr error
	if !ok {
		loc, lerr = rt.find(r.Context(), t.kind, t.id)
		if ok = lerr == nil; ok && loc.State == "" && loc.Host != rt.o.Self {
			rt.locs.put(loc)
		}
	}
	if !ok && lerr != nil && !notLocated(lerr) && rt.o.Holds != nil {
		// This host does not hold it and the directory cannot say who
		// does (no quorum): what it answers stands, but its not-found
		// would tell the client the session is gone. It is 503.
		rt.o.Local.ServeHTTP(&unlocatedWriter{ResponseWriter: w, fail: func() {
			w.Header().Del("Content-Length")
			rt.fail(w, r, t, retryAfter(errdefs.Typed(errdefs.ErrUnavailable, "",
				"%s %s: the fleet's directory cannot be read to find its host: %v", t.kind, t.id, lerr), 5*time.Second))
		}}, r)
		return
	}
	if !ok || loc.Host == rt.o.Self && loc.State == "" {
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	// What the entry says (ended, its host lost) is told only to a
	// caller of its tenant: another tenant's, as on one host, finds
	// nothing, and a request without a valid key is 401.
	var caller tenancy.Caller
	if t.caller {
		var err error
		if caller, err = rt.authenticate(r, t.e2b); err != nil {
			rt.fail(w, r, t, err)
			return
		}
		owner := loc.Tenant
		if owner == "" {
			owner = store.DefaultTenant
		}
		if owner != caller.Tenant {
			rt.fail(w, r, t, errdefs.Newf(errdefs.ErrNotFound, "%s %q", t.kind, t.id))
			return
		}
	}
	if loc.State == fleet.LocationTerminated {
		if !t.caller {
			// No key to check the tenant with (an envd or port call,
			// whose token only its host could check): why and where
			// are the owner's to know.
			rt.fail(w, r, t, errdefs.Newf(errdefs.ErrTerminated, "%s %s was terminated", t.kind, t.id))
			return
		}
		rt.fail(w, r, t, errdefs.Newf(errdefs.ErrTerminated, "%s %s was terminated: %s (its host %s)", t.kind, t.id, loc.Reason, loc.Host))
		return
	}
	if t.kind == fleet.KindSnapshot && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/fork") {
		if host := pinnedHost(r); host != "" && !t.e2b {
			rt.servePinned(w, r, t, host)
			return
		}
		if rt.pullHere(r.Context(), loc) {
			rt.o.Local.ServeHTTP(w, r)
			return
		}
	}
	rt.forwardAs(w, r, t, loc.Host, caller)
}

// pullHere reports whether a start from snapshot loc (a fork, a create
// from it) is served by this host, which then pulls the snapshot's copy
// from the object store: when loc's host is this one, or when loc is
// replicated and its host cannot take the call (lost, not in the
// registry, another version) or is draining while this one is ready.
// Otherwise the start goes next to the snapshot, on its host.
func (rt *Router) pullHere(ctx context.Context, loc fleet.Location) bool {
	if loc.Host == rt.o.Self {
		return true
	}
	if !loc.Replicated {
		return false
	}
	h, err := rt.host(ctx, loc.Host)
	if err != nil {
		return true
	}
	if h.Placeable {
		return false
	}
	self, err := rt.host(ctx, rt.o.Self)
	return err == nil && self.Placeable
}

// locate reads kind's id's directory entry; ok is false when there is
// none or the directory cannot be read (logged), and the request is
// served here.
func (rt *Router) locate(ctx context.Context, kind fleet.Kind, id string) (fleet.Location, bool) {
	loc, err := rt.find(ctx, kind, id)
	return loc, err == nil
}

// find reads kind's id's directory entry: ErrNotFound (or, for an id
// that cannot be one, ErrInvalidArgument) when there is none, another
// error (logged) when the directory cannot be read.
func (rt *Router) find(ctx context.Context, kind fleet.Kind, id string) (fleet.Location, error) {
	dir, err := rt.o.Directory()
	if err != nil {
		return fleet.Location{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	loc, err := dir.Get(ctx, kind, id)
	if err != nil && !notLocated(err) {
		rt.o.Log.Warn("fleet: directory read failed; serving locally", "kind", kind, "id", id, "err", err)
	}
	return loc, err
}

// notLocated reports whether err of find says there is no entry.
func notLocated(err error) bool {
	return errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument)
}

// forwardTo authenticates r's caller (when t says so) and proxies r to
// host's API; a request without a valid key is 401 before anything of
// host is told.
func (rt *Router) forwardTo(w http.ResponseWriter, r *http.Request, t target, host string) {
	var caller tenancy.Caller
	if t.caller {
		var err error
		if caller, err = rt.authenticate(r, t.e2b); err != nil {
			rt.fail(w, r, t, err)
			return
		}
	}
	rt.forwardAs(w, r, t, host, caller)
}

// forwardAs proxies r to host's API carrying caller (authenticated
// already when t.caller).
func (rt *Router) forwardAs(w http.ResponseWriter, r *http.Request, t target, host string, caller tenancy.Caller) {
	h, err := rt.host(r.Context(), host)
	if err != nil {
		rt.fail(w, r, t, err)
		return
	}
	rt.proxy(w, r, t, h, caller)
}

// host returns host id's registry record: ErrUnavailable when it is not
// there, lost or not placeable (another version).
func (rt *Router) host(ctx context.Context, id string) (fleet.Host, error) {
	hs, err := rt.hosts.get(ctx)
	if err != nil {
		return fleet.Host{}, err
	}
	for _, h := range hs {
		if h.ID != id {
			continue
		}
		if h.State == fleet.HostLost {
			return fleet.Host{}, retryAfter(errdefs.Typed(errdefs.ErrUnavailable, "", "host %s, which holds it, is not answering heartbeats", id), 5*time.Second)
		}
		if !fleet.Compatible(versionOf(hs, rt.o.Self), h.Version) {
			return fleet.Host{}, errdefs.Newf(errdefs.ErrUnavailable, "host %s, which holds it, runs forkbox %s, which this host cannot route to", id, h.Version)
		}
		return h, nil
	}
	return fleet.Host{}, errdefs.Newf(errdefs.ErrUnavailable, "host %s, which holds it, is not in the fleet's host registry", id)
}

func versionOf(hs []fleet.Host, id string) string {
	for _, h := range hs {
		if h.ID == id {
			return h.Version
		}
	}
	return ""
}

// authenticate checks r's API key (X-API-Key preferred on E2B's wire,
// as the E2B handler does) and returns its caller; ErrUnauthenticated
// when it has none or a bad one.
func (rt *Router) authenticate(r *http.Request, preferHeader bool) (tenancy.Caller, error) {
	secret := access.Secret(r, preferHeader)
	if secret == "" {
		return tenancy.Caller{}, errdefs.Newf(errdefs.ErrUnauthenticated, "missing API key")
	}
	key, err := rt.o.Keys.AuthenticateKey(r.Context(), secret)
	if err != nil {
		if errors.Is(err, errdefs.ErrUnauthenticated) {
			return tenancy.Caller{}, errdefs.Newf(errdefs.ErrUnauthenticated, "invalid API key")
		}
		return tenancy.Caller{}, err
	}
	return tenancy.Caller{Tenant: key.Tenant, KeyID: key.ID, Admin: key.Admin}, nil
}

// proxy forwards r to h's API as is (body streamed, responses flushed
// as they come), signed with caller (t.caller) or as this host only;
// the caller's key is not passed on when the caller is carried.
func (rt *Router) proxy(w http.ResponseWriter, r *http.Request, t target, h fleet.Host, caller tenancy.Caller) {
	u, err := url.Parse(h.API)
	if err != nil || u.Host == "" {
		rt.fail(w, r, t, errdefs.Newf(errdefs.ErrUnavailable, "host %s has no usable API URL (%q)", h.ID, h.API))
		return
	}
	u.Path, u.RawPath = "", ""
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host // PORT-ID.DOMAIN names the port
			pr.SetXForwarded()
			if t.caller {
				pr.Out.Header.Del("Authorization")
				pr.Out.Header.Del("X-Api-Key")
			}
			rt.signer.Sign(pr.Out.Header, h.ID, pr.Out.Method, pr.Out.URL.RequestURI(), caller, t.caller)
		},
		Transport:     rt.transport,
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(rt.o.Log.Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			rt.o.Log.Warn("fleet: forwarding failed", "host", h.ID, "method", r.Method, "path", r.URL.Path, "err", err)
			rt.fail(w, r, t, errdefs.Newf(errdefs.ErrUnavailable, "host %s did not answer: %v", h.ID, err))
		},
	}
	// The host may answer (and the proxy flush the response headers)
	// before the end of the request body is copied (a Connect stream's
	// closing chunk, an upload): without full duplex the HTTP/1 server
	// then closes the request body under the copy, the transport tears
	// the upstream connection down and the client's stream is cut
	// ("terminated").
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		rt.o.Log.Debug("fleet: full duplex unavailable for a forwarded call", "err", err)
	}
	w.Header().Set("Forkbox-Host", h.ID)
	p.ServeHTTP(w, r)
}

// pinnedHost returns the host a fork's body names (v1.ForkRequest's
// host), or "" when it names none or cannot be read for it (the API
// then answers the body).
func pinnedHost(r *http.Request) string {
	b, all, err := peekBody(r, maxPeek)
	if err != nil || !all {
		return ""
	}
	var body struct {
		Host string `json:"host"`
	}
	if json.Unmarshal(b, &body) != nil {
		return ""
	}
	return body.Host
}
