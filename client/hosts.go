package client

import (
	"context"
	"net/http"
	"net/url"
)

// Hosts lists the fleet's hosts (GET /v1/hosts; an admin key), with the
// answering host's id. A key that is not an admin's is
// errdefs.ErrPermissionDenied.
func (c *Client) Hosts(ctx context.Context) (*HostList, error) {
	out := &HostList{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/hosts", nil, nil, nil, out)
	return out, err
}

// DrainHost sets host id's drain flag (POST /v1/hosts/{id}/drain; an
// admin key) and returns its record, draining: no placements go there and
// its sessions run on until they end. An unknown host is
// errdefs.ErrNotFound.
func (c *Client) DrainHost(ctx context.Context, id string) (*Host, error) {
	out := &Host{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/hosts/"+url.PathEscape(id)+"/drain", nil, nil, nil, out)
	return out, err
}

// UndrainHost clears host id's drain flag (POST /v1/hosts/{id}/undrain;
// an admin key) and returns its record, ready again unless it is lost.
func (c *Client) UndrainHost(ctx context.Context, id string) (*Host, error) {
	out := &Host{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/hosts/"+url.PathEscape(id)+"/undrain", nil, nil, nil, out)
	return out, err
}
