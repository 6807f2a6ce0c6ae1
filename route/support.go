package route

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/forkbox/forkbox/api"
	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
)

// fail answers err in r's wire: a problem (RFC 9457) on forkbox's paths,
// E2B's {code, message} on E2B's (where an ended session is 404 on the
// control plane, and envd and port requests that cannot be served 502,
// as E2B's edge answers them).
func (rt *Router) fail(w http.ResponseWriter, r *http.Request, t target, err error) {
	var te *errdefs.TypedError
	if errors.As(err, &te) && te.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((te.RetryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set(access.RequestIDHeader, r.Header.Get(access.RequestIDHeader))
	if errdefs.Class(err) == errdefs.ErrUnauthenticated && !t.e2b {
		w.Header().Set("WWW-Authenticate", `Bearer realm="forkbox", error="invalid_token"`)
	}
	if t.e2b {
		status := http.StatusInternalServerError
		switch errdefs.Class(err) {
		case errdefs.ErrUnauthenticated:
			status = http.StatusUnauthorized
		case errdefs.ErrNotFound, errdefs.ErrTerminated:
			status = http.StatusNotFound
		case errdefs.ErrUnavailable:
			status = http.StatusServiceUnavailable
		case errdefs.ErrInvalidArgument:
			status = http.StatusBadRequest
		case errdefs.ErrConflict:
			status = http.StatusConflict
		}
		if !t.caller && status != http.StatusUnauthorized {
			// envd and port requests: E2B's edge answers 502 for a
			// sandbox it cannot reach (killed, or its host gone).
			status = http.StatusBadGateway
		}
		writeJSON(w, status, map[string]any{"code": status, "message": err.Error()})
		return
	}
	p := api.ProblemFor(err)
	p.Instance, p.RequestID = r.URL.Path, r.Header.Get(access.RequestIDHeader)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// retryAfter sets te's RetryAfter to d and returns it.
func retryAfter(te *errdefs.TypedError, d time.Duration) error {
	te.RetryAfter = d
	return te
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// peekBody reads up to limit bytes of r's body and puts them back in
// front of the rest, returning what it read; all is false when the body
// is longer.
func peekBody(r *http.Request, limit int64) (b []byte, all bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true, nil
	}
	b, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, false, err
	}
	all = int64(len(b)) <= limit
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), r.Body), r.Body}
	return b, all, nil
}

// hostCache is the host registry as read at most a second ago. One
// read runs at a time and the lock is not held across it: while it runs,
// a list read in the last 10 s answers at once, and without one callers
// wait for that read's result (or their own context), so a registry slow
// to answer (a quorum lost) costs each request one read at most, not
// one per request queued before it.
type hostCache struct {
	list func(ctx context.Context) ([]fleet.Host, error)
	mu   sync.Mutex
	at   time.Time
	hs   []fleet.Host
	// reading is closed when the read under way ends (nil: none); err
	// is the last read's error.
	reading chan struct{}
	err     error
}

// staleFor is how long a list read before answers while the registry
// cannot be read.
const staleFor = 10 * time.Second

func (c *hostCache) get(ctx context.Context) ([]fleet.Host, error) {
	c.mu.Lock()
	if c.hs != nil && time.Since(c.at) < time.Second {
		defer c.mu.Unlock()
		return c.hs, nil
	}
	if ch := c.reading; ch != nil {
		if c.hs != nil && time.Since(c.at) < staleFor {
			defer c.mu.Unlock()
			return c.hs, nil
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return c.result()
	}
	ch := make(chan struct{})
	c.reading = ch
	c.mu.Unlock()
	// The read is not cut short by this caller going away: others wait on it.
	hs, err := c.list(context.WithoutCancel(ctx))
	c.mu.Lock()
	c.reading, c.err = nil, err
	if err == nil {
		c.hs, c.at = hs, time.Now()
	}
	close(ch)
	c.mu.Unlock()
	return c.result()
}

// result is the list as last read: the last read's error when it failed
// and the list before it is older than staleFor.
func (c *hostCache) result() ([]fleet.Host, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil && (c.hs == nil || time.Since(c.at) >= staleFor) {
		return nil, c.err
	}
	return c.hs, nil
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// locationTTL is how long a router trusts a live entry of another host
// it read: a session does not change hosts under it (a migration keeps
// the old host answering until then), and an owner that went away makes
// the router read the entry again at once.
const locationTTL = 5 * time.Second

// maxCachedLocations bounds the location cache.
const maxCachedLocations = 1 << 16

// locationCache keeps live directory entries of other hosts for
// locationTTL, so a routed call costs no directory read most of the time.
type locationCache struct {
	mu sync.Mutex
	m  map[string]cachedLocation
}

type cachedLocation struct {
	loc   fleet.Location
	until time.Time
}

func (c *locationCache) get(kind fleet.Kind, id string) (fleet.Location, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[string(kind)+"/"+id]
	if !ok || time.Now().After(e.until) {
		return fleet.Location{}, false
	}
	return e.loc, true
}

func (c *locationCache) put(l fleet.Location) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.m == nil {
		c.m = map[string]cachedLocation{}
	}
	if len(c.m) >= maxCachedLocations {
		for k, e := range c.m {
			if now.After(e.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCachedLocations {
			clear(c.m)
		}
	}
	c.m[string(l.Kind)+"/"+l.ID] = cachedLocation{loc: l, until: now.Add(locationTTL)}
}

// unlocatedWriter passes on what this host's API answers for what it
// does not hold while the directory cannot be read, except a not-found,
// which fail answers instead (and the API's body is dropped).
type unlocatedWriter struct {
	http.ResponseWriter
	fail     func()
	wrote    bool
	replaced bool
}

func (u *unlocatedWriter) WriteHeader(code int) {
	if u.wrote || u.replaced {
		return
	}
	if code == http.StatusNotFound {
		u.replaced = true
		u.fail()
		return
	}
	u.wrote = true
	u.ResponseWriter.WriteHeader(code)
}

func (u *unlocatedWriter) Write(b []byte) (int, error) {
	if !u.wrote && !u.replaced {
		u.WriteHeader(http.StatusOK)
	}
	if u.replaced {
		return len(b), nil
	}
	return u.ResponseWriter.Write(b)
}

// Flush passes a flush on (http.Flusher) unless the answer was replaced.
func (u *unlocatedWriter) Flush() {
	if f, ok := u.ResponseWriter.(http.Flusher); ok && !u.replaced {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the writer beneath.
func (u *unlocatedWriter) Unwrap() http.ResponseWriter { return u.ResponseWriter }
