package route

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/tenancy"
)

// SkippedHeader names, on a list's answer, the hosts (comma-separated
// ids) whose part is missing: they did not answer within listTimeout or
// answered an error. Each skip is also logged.
const SkippedHeader = "Forkbox-Hosts-Skipped"

// listTimeout bounds how long a list waits for each other host.
const listTimeout = 5 * time.Second

// maxListBody bounds one host's list answer, in bytes.
const maxListBody = 64 << 20

// listKey is the member of forkbox's list bodies that holds the items
// ("sessions", "snapshots"); E2B's lists are bare arrays.
func listKey(path string) string {
	if strings.HasPrefix(path, "/v1/") {
		return strings.TrimPrefix(path, "/v1/")
	}
	return ""
}

// part is one host's answer to a list.
type part struct {
	host   string
	status int
	header http.Header
	body   []byte
	err    error
}

// serveList answers a list with the fleet's: forkbox's lists merge
// this host's answer and every other host's that is not lost and of a
// compatible version (asked with the caller signed, in parallel,
// listTimeout each; items get a "host" member), newest first, at most
// the request's limit; E2B's page host by host (serveE2BPages).
func (rt *Router) serveList(w http.ResponseWriter, r *http.Request, t target) {
	caller, err := rt.authenticate(r, t.e2b)
	if err != nil {
		rt.fail(w, r, t, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), listTimeout)
	hs, err := rt.hosts.get(ctx)
	cancel()
	if err != nil {
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	if t.e2b {
		rt.serveE2BPages(w, r, hs, caller)
		return
	}
	var peers []fleet.Host
	mine := versionOf(hs, rt.o.Self)
	for _, h := range hs {
		// Draining hosts still hold sessions: every host not lost and of
		// a compatible version is asked.
		if h.ID != rt.o.Self && h.State != fleet.HostLost && fleet.Compatible(mine, h.Version) {
			peers = append(peers, h)
		}
	}
	parts := make([]part, len(peers)+1)
	var wg sync.WaitGroup
	for i, h := range peers {
		wg.Add(1)
		go func() { defer wg.Done(); parts[i+1] = rt.askPeer(r, h, caller, r.URL.RawQuery) }()
	}
	rec := &bufferWriter{header: http.Header{}, status: http.StatusOK}
	rt.o.Local.ServeHTTP(rec, r)
	parts[0] = part{host: rt.o.Self, status: rec.status, header: rec.header, body: rec.buf.Bytes()}
	wg.Wait()
	if parts[0].status != http.StatusOK {
		copyHeader(w.Header(), rec.header)
		w.WriteHeader(rec.status)
		_, _ = w.Write(parts[0].body)
		return
	}
	key := listKey(r.URL.Path)
	var items []json.RawMessage
	var skipped []string
	for _, p := range parts {
		got, err := listItems(p, key)
		if err != nil {
			rt.o.Log.Warn("fleet: a host's part of a list is missing", "host", p.host, "path", r.URL.Path, "err", err)
			skipped = append(skipped, p.host)
			continue
		}
		items = append(items, got...)
	}
	if key != "" {
		sortNewestFirst(items)
	}
	if n, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && n > 0 && len(items) > n {
		items = items[:n]
	}
	if items == nil {
		items = []json.RawMessage{}
	}
	if id := rec.header.Get(access.RequestIDHeader); id != "" {
		w.Header().Set(access.RequestIDHeader, id)
	}
	if len(skipped) > 0 {
		w.Header().Set(SkippedHeader, strings.Join(skipped, ","))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if key == "" {
		_ = json.NewEncoder(w).Encode(items)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{key: items})
}

// askPeer sends r's list, with query rawQuery, to host h, signed with
// caller.
func (rt *Router) askPeer(r *http.Request, h fleet.Host, caller tenancy.Caller, rawQuery string) part {
	p := part{host: h.ID}
	u, err := url.Parse(h.API)
	if err != nil {
		p.err = err
		return p
	}
	u.Path, u.RawQuery = r.URL.Path, rawQuery
	ctx, cancel := context.WithTimeout(r.Context(), listTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		p.err = err
		return p
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set(access.RequestIDHeader, r.Header.Get(access.RequestIDHeader))
	rt.signer.Sign(req.Header, h.ID, http.MethodGet, req.URL.RequestURI(), caller, true)
	resp, err := rt.transport.RoundTrip(req)
	if err != nil {
		p.err = err
		return p
	}
	defer resp.Body.Close()
	p.status, p.header = resp.StatusCode, resp.Header
	p.body, p.err = io.ReadAll(io.LimitReader(resp.Body, maxListBody))
	return p
}

// listItems returns the items of one host's part: forkbox's (under key)
// each with "host" added, E2B's as they are.
func listItems(p part, key string) ([]json.RawMessage, error) {
	if p.err != nil {
		return nil, p.err
	}
	if p.status != http.StatusOK {
		return nil, &statusError{p.status}
	}
	var items []json.RawMessage
	if key == "" {
		if err := json.Unmarshal(p.body, &items); err != nil {
			return nil, err
		}
		return items, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(p.body, &obj); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(obj[key], &items); err != nil && obj[key] != nil {
		return nil, err
	}
	host, _ := json.Marshal(p.host)
	for i, it := range items {
		var m map[string]json.RawMessage
		if json.Unmarshal(it, &m) != nil {
			continue
		}
		m["host"] = host
		if b, err := json.Marshal(m); err == nil {
			items[i] = b
		}
	}
	return items, nil
}

// sortNewestFirst orders forkbox's list items by created_at, newest
// first, as each host lists them.
func sortNewestFirst(items []json.RawMessage) {
	created := make([]string, len(items))
	for i, it := range items {
		var v struct {
			CreatedAt string `json:"created_at"`
		}
		_ = json.Unmarshal(it, &v)
		created[i] = v.CreatedAt
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		ta, _ := time.Parse(time.RFC3339Nano, created[idx[a]])
		tb, _ := time.Parse(time.RFC3339Nano, created[idx[b]])
		return ta.After(tb)
	})
	out := make([]json.RawMessage, len(items))
	for i, j := range idx {
		out[i] = items[j]
	}
	copy(items, out)
}

type statusError struct{ status int }

func (e *statusError) Error() string { return "answered HTTP " + strconv.Itoa(e.status) }

// bufferWriter keeps what a handler writes.
type bufferWriter struct {
	header http.Header
	status int
	wrote  bool
	buf    bytes.Buffer
}

func (b *bufferWriter) Header() http.Header { return b.header }
func (b *bufferWriter) WriteHeader(code int) {
	if !b.wrote {
		b.status, b.wrote = code, true
	}
}
func (b *bufferWriter) Write(p []byte) (int, error) {
	b.wrote = true
	return b.buf.Write(p)
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = vs
	}
}
