package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	v1 "github.com/forkbox/forkbox/api/v1"
)

// CreateSession creates a session. With an idempotencyKey, a retry returns
// the first call's session; replayed then reports true.
func (c *Client) CreateSession(ctx context.Context, req CreateRequest, idempotencyKey string) (s *Session, replayed bool, err error) {
	var h http.Header
	if idempotencyKey != "" {
		h = http.Header{"Idempotency-Key": {idempotencyKey}}
	}
	s = &Session{}
	resp, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions", nil, h, req, s)
	if err != nil {
		return nil, false, err
	}
	return s, resp.Header.Get("Idempotent-Replayed") == "true", nil
}

// GetSession returns one session (also an ended one).
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	s := &Session{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id), nil, nil, nil, s)
	return s, err
}

// ListOptions filter ListSessions.
type ListOptions struct {
	// States: "creating", "running", "terminating", "terminated"; empty
	// lists sessions that have not ended; All lists every session.
	States   []string
	All      bool
	Metadata map[string]string
	Limit    int
}

// ListSessions returns sessions, newest first.
func (c *Client) ListSessions(ctx context.Context, opts ListOptions) ([]Session, error) {
	q := url.Values{}
	switch {
	case opts.All:
		q.Set("state", "all")
	case len(opts.States) > 0:
		q.Set("state", strings.Join(opts.States, ","))
	}
	for k, v := range opts.Metadata {
		q.Set("metadata."+k, v)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var out v1.SessionList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions", q, nil, nil, &out)
	return out.Sessions, err
}

// DeleteSession destroys a session now.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	if err := checkID("session", id); err != nil {
		return err
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(id), nil, nil, nil, nil)
	return err
}

// SetTimeout makes the session end seconds from now.
func (c *Client) SetTimeout(ctx context.Context, id string, seconds int64) (*Session, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	s := &Session{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/timeout", nil, nil,
		v1.TimeoutRequest{TimeoutS: seconds}, s)
	return s, err
}

// Usage reads a session's resource use.
func (c *Client) Usage(ctx context.Context, id string) (*Usage, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	u := &Usage{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/usage", nil, nil, nil, u)
	return u, err
}

// Egress returns up to limit (1-1000) of a session's egress records, oldest
// first, after the first skip.
func (c *Client) Egress(ctx context.Context, id string, skip, limit int) ([]EgressRecord, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	var out v1.EgressList
	q := url.Values{"skip": {strconv.Itoa(skip)}, "limit": {strconv.Itoa(limit)}}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/egress", q, nil, nil, &out)
	return out.Records, err
}

// Info returns the daemon's version, drivers and limits.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	i := &Info{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/info", nil, nil, nil, i)
	return i, err
}
