package e2b

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/node"
)

// List paging: limit defaults to and is capped at 100, as in E2B's API.
const maxListLimit = 100

// nextTokenHeader carries the cursor of the next page; absent on the last.
const nextTokenHeader = "X-Next-Token"

// handleList: GET /v2/sandboxes (and GET /sandboxes, E2B's older list) →
// 200 ListedSandbox[], newest first unless order=asc.
//
// Query (style form, explode false, as the SDK sends it):
//   - state: running,paused (the default: both);
//   - metadata: the filter, triple-encoded (see parseMetadata);
//   - template: a template (or snapshot) id;
//   - startedAfter: RFC 3339;
//   - order: asc or desc;
//   - limit: 1..100 (default 100) and nextToken: paging, with the next
//     page's token in the X-Next-Token response header.
func (h *Handler) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := listFilter(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	limit := f.Limit
	f.Limit = limit + 1 // one more, to know whether there is a next page
	recs, err := h.mgr.List(r.Context(), f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	recs = cutPage(w, recs, limit, func(rec *node.Session) node.ListCursor {
		return node.ListCursor{CreatedAt: rec.CreatedAt, ID: rec.ID}
	})
	out := make([]sandboxDetail, 0, len(recs))
	for _, rec := range recs {
		out = append(out, listedOf(rec))
	}
	httpjson.Write(w, http.StatusOK, out)
}

// listFilter reads the list query into a store filter.
func listFilter(q url.Values) (node.SessionFilter, error) {
	f := node.SessionFilter{Limit: maxListLimit}
	f.States = []node.State{node.StateRunning, node.StatePaused}
	if v := q.Get("state"); v != "" {
		f.States = nil
		for _, s := range strings.Split(v, ",") {
			switch st := node.State(strings.TrimSpace(s)); st {
			case node.StateRunning, node.StatePaused:
				f.States = append(f.States, st)
			default:
				return f, errdefs.InvalidField("state", "%q is not running or paused", s)
			}
		}
	}
	if v := q.Get("metadata"); v != "" {
		m, err := parseMetadata(v)
		if err != nil {
			return f, err
		}
		f.Metadata = m
	}
	f.Template = q.Get("template")
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, errdefs.InvalidField("startedAfter", "must be an RFC 3339 time")
		}
		f.CreatedAfter = t
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		f.Ascending = true
	default:
		return f, errdefs.InvalidField("order", "must be asc or desc")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return f, errdefs.InvalidField("limit", "must be between 1 and %d", maxListLimit)
		}
		f.Limit = n
	}
	if v := q.Get("nextToken"); v != "" {
		c, err := decodeCursor(v)
		if err != nil {
			return f, err
		}
		f.After = &c
	}
	return f, nil
}

// parseMetadata decodes the list's metadata filter. The SDK encodes
// {k: v} as the query string "k=v&..." with keys and values
// query-escaped, query-escapes that whole string, and the URL encoding
// escapes it once more (e2b-dev/infra
// packages/api/internal/utils/sandboxes_list.go does the same steps). After
// url.Values has undone the last: unescape the whole, split on & and =,
// unescape each key and value.
func parseMetadata(v string) (map[string]string, error) {
	bad := errdefs.InvalidField("metadata", "must be a query-encoded list of key=value pairs")
	whole, err := url.QueryUnescape(v)
	if err != nil {
		return nil, bad
	}
	out := map[string]string{}
	for _, pair := range strings.Split(whole, "&") {
		if pair == "" {
			continue
		}
		k, val, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, bad
		}
		if k, err = url.QueryUnescape(k); err != nil {
			return nil, bad
		}
		if val, err = url.QueryUnescape(val); err != nil {
			return nil, bad
		}
		out[k] = val
	}
	return out, nil
}

// cutPage returns the first limit items; when there are more it sets the
// X-Next-Token header to the cursor (from key) of the last one returned.
func cutPage[T any](w http.ResponseWriter, items []T, limit int, key func(T) node.ListCursor) []T {
	if len(items) <= limit {
		return items
	}
	items = items[:limit]
	w.Header().Set(nextTokenHeader, encodeCursor(key(items[limit-1])))
	return items
}

// encodeCursor makes the opaque nextToken: base64url of
// "<created_at unix ms>_<id>".
func encodeCursor(c node.ListCursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.CreatedAt.UnixMilli(), 10) + "_" + c.ID))
}

func decodeCursor(tok string) (node.ListCursor, error) {
	bad := errdefs.InvalidField("nextToken", "is not a token from a previous page")
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return node.ListCursor{}, bad
	}
	msPart, id, ok := strings.Cut(string(raw), "_")
	ms, err := strconv.ParseInt(msPart, 10, 64)
	if !ok || err != nil || id == "" {
		return node.ListCursor{}, bad
	}
	return node.ListCursor{CreatedAt: time.UnixMilli(ms).UTC(), ID: id}, nil
}
