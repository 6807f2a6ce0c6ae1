package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
)

// CreateVolume makes the caller's tenant's volume name with a quota of
// sizeMB MiB. errdefs.ErrConflict when the name is taken;
// errdefs.ErrInvalidArgument naming name or size_mb.
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (*Volume, error) {
	out := &Volume{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/volumes", nil, nil, v1.VolumeRequest{Name: name, SizeMB: sizeMB}, out)
	return out, err
}

// Volumes lists the caller's tenant's volumes by name.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var out v1.VolumeList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/volumes", nil, nil, nil, &out)
	return out.Volumes, err
}

// GetVolume returns volume name (errdefs.ErrNotFound for none).
func (c *Client) GetVolume(ctx context.Context, name string) (*Volume, error) {
	if err := checkVolumeName(name); err != nil {
		return nil, err
	}
	out := &Volume{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(name), nil, nil, nil, out)
	return out, err
}

// DeleteVolume removes volume name and its files. errdefs.ErrConflict
// while a session mounts it; errdefs.ErrNotFound for none.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	if err := checkVolumeName(name); err != nil {
		return err
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(name), nil, nil, nil, nil)
	return err
}

// checkVolumeName refuses names that cannot be one path segment.
func checkVolumeName(name string) error {
	if name == "" || name == "." || name == ".." {
		return &errdefs.FieldError{Field: "name", Reason: fmt.Sprintf("%q is not a volume name", name)}
	}
	return nil
}
