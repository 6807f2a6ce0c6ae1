package client

import (
	"context"
	"net/http"
)

// Hosts lists the fleet's hosts (GET /v1/hosts; an admin key), with the
// answering host's id. A key that is not an admin's is
// errdefs.ErrPermissionDenied.
func (c *Client) Hosts(ctx context.Context) (*HostList, error) {
	out := &HostList{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/hosts", nil, nil, nil, out)
	return out, err
}
