package route

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/tenancy"
)

// e2bPageLimit is E2B's list page size when the request names none
// (and its largest).
const e2bPageLimit = 100

// fleetTokenPrefix marks a nextToken of the fleet's E2B lists.
const fleetTokenPrefix = "fbx1."

// fleetToken is where the next page of a fleet's E2B list starts: at
// host Host, from that host's own nextToken Token ("" for its first).
type fleetToken struct {
	Host  string `json:"h"`
	Token string `json:"t,omitempty"`
}

func (ft fleetToken) encode() string {
	b, _ := json.Marshal(ft)
	return fleetTokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func decodeFleetToken(s string) (fleetToken, bool) {
	rest, ok := strings.CutPrefix(s, fleetTokenPrefix)
	if !ok {
		return fleetToken{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	var ft fleetToken
	if err != nil || json.Unmarshal(b, &ft) != nil || ft.Host == "" {
		return fleetToken{}, false
	}
	return ft, true
}

// serveE2BPages answers an E2B list (sandboxes, snapshots) with the
// fleet's, host by host: the hosts in id order (this host among them),
// each asked for what the page still has room for, from where the
// previous page stopped, each host's items in its own order. When a page
// fills, X-Next-Token is a fleet token naming the host (and that host's
// own token) the next page starts at. A host that does not answer is
// skipped (SkippedHeader, logged). Pages do not interleave hosts'
// items by time: a list through one host pages through a, then b, ...
func (rt *Router) serveE2BPages(w http.ResponseWriter, r *http.Request, hs []fleet.Host, caller tenancy.Caller) {
	q := r.URL.Query()
	limit := e2bPageLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			rt.o.Local.ServeHTTP(w, r) // its 400 naming limit
			return
		}
		limit = n
	}
	start := fleetToken{}
	if v := q.Get("nextToken"); v != "" {
		ft, ok := decodeFleetToken(v)
		if !ok {
			rt.o.Local.ServeHTTP(w, r) // a host's own token, or its 400
			return
		}
		start = ft
	}
	mine := versionOf(hs, rt.o.Self)
	var order []fleet.Host
	for _, h := range hs {
		if h.ID == rt.o.Self || h.State != fleet.HostLost && fleet.Compatible(mine, h.Version) {
			order = append(order, h)
		}
	}
	sort.Slice(order, func(i, j int) bool { return order[i].ID < order[j].ID })
	i := 0
	if start.Host != "" {
		i = len(order)
		for j, h := range order {
			if h.ID >= start.Host {
				i = j
				break
			}
		}
		if i < len(order) && order[i].ID != start.Host {
			start.Token = "" // that host left: go on with the next
		}
	}
	items := []json.RawMessage{}
	var skipped []string
	next := ""
	tok := start.Token
	for ; i < len(order) && len(items) < limit; i, tok = i+1, "" {
		h := order[i]
		pq := url.Values{}
		for k, v := range q {
			pq[k] = v
		}
		pq.Set("limit", strconv.Itoa(limit-len(items)))
		pq.Del("nextToken")
		if tok != "" {
			pq.Set("nextToken", tok)
		}
		var p part
		if h.ID == rt.o.Self {
			p = rt.askSelf(r, pq.Encode())
		} else {
			p = rt.askPeer(r, h, caller, pq.Encode())
		}
		got, err := listItems(p, "")
		if err != nil {
			if h.ID == rt.o.Self && p.status != 0 && p.status != http.StatusOK {
				// This host's own refusal (a bad filter): say it as it is.
				copyHeader(w.Header(), p.header)
				w.WriteHeader(p.status)
				_, _ = w.Write(p.body)
				return
			}
			rt.o.Log.Warn("fleet: a host's part of a list is missing", "host", h.ID, "path", r.URL.Path, "err", err)
			skipped = append(skipped, h.ID)
			continue
		}
		items = append(items, got...)
		if t := p.header.Get("X-Next-Token"); t != "" {
			next = fleetToken{Host: h.ID, Token: t}.encode()
			break
		}
		if len(items) >= limit && i+1 < len(order) {
			next = fleetToken{Host: order[i+1].ID}.encode()
		}
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	if len(skipped) > 0 {
		w.Header().Set(SkippedHeader, strings.Join(skipped, ","))
	}
	w.Header().Set(access.RequestIDHeader, r.Header.Get(access.RequestIDHeader))
	writeJSON(w, http.StatusOK, items)
}

// askSelf runs r with query rawQuery through this host's API.
func (rt *Router) askSelf(r *http.Request, rawQuery string) part {
	r2 := r.Clone(r.Context())
	r2.URL.RawQuery = rawQuery
	r2.RequestURI = r2.URL.RequestURI()
	rec := &bufferWriter{header: http.Header{}, status: http.StatusOK}
	rt.o.Local.ServeHTTP(rec, r2)
	return part{host: rt.o.Self, status: rec.status, header: rec.header, body: rec.buf.Bytes()}
}
