package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// CreateRequest asks for a session; zero fields take the daemon's defaults.
type CreateRequest struct {
	Template string            `json:"template,omitempty"`
	CPU      float64           `json:"cpu,omitempty"`       // cores
	MemoryMB int64             `json:"memory_mb,omitempty"` // MiB
	Pids     int64             `json:"pids,omitempty"`
	TimeoutS int64             `json:"timeout_s,omitempty"` // seconds
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	User     string            `json:"user,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
}

// Session is a sandbox session as the API reports it.
type Session struct {
	ID        string            `json:"id"`
	Template  string            `json:"template"`
	Driver    string            `json:"driver"`
	State     string            `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	Detail    string            `json:"detail,omitempty"`
	CPU       float64           `json:"cpu"`
	MemoryMB  int64             `json:"memory_mb"`
	Pids      int64             `json:"pids"`
	TimeoutS  int64             `json:"timeout_s"`
	User      string            `json:"user"`
	Workdir   string            `json:"workdir,omitempty"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt *time.Time        `json:"created_at,omitempty"`
	StartedAt *time.Time        `json:"started_at,omitempty"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	EndedAt   *time.Time        `json:"ended_at,omitempty"`
}

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
	var out struct {
		Sessions []Session `json:"sessions"`
	}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions", q, nil, nil, &out)
	return out.Sessions, err
}

// DeleteSession destroys a session now.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(id), nil, nil, nil, nil)
	return err
}

// SetTimeout makes the session end seconds from now.
func (c *Client) SetTimeout(ctx context.Context, id string, seconds int64) (*Session, error) {
	s := &Session{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/timeout", nil, nil,
		map[string]int64{"timeout_s": seconds}, s)
	return s, err
}

// Usage is a session's resource use.
type Usage struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryBytes     int64   `json:"memory_bytes"`
	MemoryPeakBytes int64   `json:"memory_peak_bytes"`
	Pids            int64   `json:"pids"`
	DiskBytes       int64   `json:"disk_bytes"`
	OOMKills        int64   `json:"oom_kills"`
}

// Usage reads a session's resource use.
func (c *Client) Usage(ctx context.Context, id string) (*Usage, error) {
	u := &Usage{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/usage", nil, nil, nil, u)
	return u, err
}

// Info describes the daemon.
type Info struct {
	Version       string `json:"version"`
	EnvdVersion   string `json:"envd_version"`
	DefaultDriver string `json:"default_driver"`
	Drivers       []struct {
		Name         string          `json:"name"`
		Capabilities map[string]bool `json:"capabilities"`
	} `json:"drivers"`
	Limits map[string]float64 `json:"limits"`
}

// Info returns the daemon's version, drivers and limits.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	i := &Info{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/info", nil, nil, nil, i)
	return i, err
}
