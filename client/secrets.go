package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
)

// SetSecret sets the caller's tenant's secret name to value, sendable to
// hosts over TLS only, with the optional header template ("Authorization:
// Bearer {value}"; "" replaces the placeholder wherever it appears). The
// value goes as the request body, byte for byte. It returns the secret as
// stored (no value) and whether it was new. Bad input is
// errdefs.ErrInvalidArgument naming name, hosts, header or value.
func (c *Client) SetSecret(ctx context.Context, name string, hosts []string, header string, value []byte) (*Secret, bool, error) {
	if name == "" || name == "." || name == ".." {
		return nil, false, &errdefs.FieldError{Field: "name", Reason: fmt.Sprintf("%q is not a secret name", name)}
	}
	q := url.Values{"host": hosts}
	if header != "" {
		q.Set("header", header)
	}
	resp, err := c.do(ctx, request{method: http.MethodPut, path: "/v1/secrets/" + url.PathEscape(name), query: q,
		body: bytes.NewReader(value), size: int64(len(value)), contentType: "application/octet-stream", accept: "application/json"})
	if err != nil {
		return nil, false, err
	}
	defer closeBody(resp)
	var s Secret
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return nil, false, fmt.Errorf("decode PUT /v1/secrets/%s reply: %w", name, err)
	}
	return &s, resp.StatusCode == http.StatusCreated, nil
}

// Secrets lists the caller's tenant's secrets by name (never values).
func (c *Client) Secrets(ctx context.Context) ([]Secret, error) {
	var out v1.SecretList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/secrets", nil, nil, nil, &out)
	return out.Secrets, err
}

// DeleteSecret removes the caller's tenant's secret name: every
// placeholder for it stops working at once. errdefs.ErrNotFound when there
// is none.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	if name == "" || name == "." || name == ".." {
		return &errdefs.FieldError{Field: "name", Reason: fmt.Sprintf("%q is not a secret name", name)}
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name), nil, nil, nil, nil)
	return err
}
