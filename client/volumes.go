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

// CreateVolumeFrom makes the caller's tenant's volume name as a writable
// copy of its volume snapshot from (an id or a name), with a quota of
// sizeMB MiB (0: the snapshotted volume's). errdefs.ErrInvalidArgument
// naming from when there is no such snapshot.
func (c *Client) CreateVolumeFrom(ctx context.Context, name, from string, sizeMB int64) (*Volume, error) {
	out := &Volume{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/volumes", nil, nil, v1.VolumeRequest{Name: name, SizeMB: sizeMB, From: from}, out)
	return out, err
}

// SnapshotVolume takes a read-only snapshot of volume name, named
// snapName ("" for none). errdefs.ErrNotFound for no such volume.
func (c *Client) SnapshotVolume(ctx context.Context, name, snapName string) (*VolumeSnapshot, error) {
	if err := checkVolumeName(name); err != nil {
		return nil, err
	}
	out := &VolumeSnapshot{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/volumes/"+url.PathEscape(name)+"/snapshots", nil, nil,
		v1.VolumeSnapshotRequest{Name: snapName}, out)
	return out, err
}

// VolumeSnapshots lists volume name's own snapshots, oldest first.
func (c *Client) VolumeSnapshots(ctx context.Context, name string) ([]VolumeSnapshot, error) {
	if err := checkVolumeName(name); err != nil {
		return nil, err
	}
	var out v1.VolumeSnapshotList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(name)+"/snapshots", nil, nil, nil, &out)
	return out.Snapshots, err
}

// DeleteVolumeSnapshot removes volume name's snapshot ref (id or name).
func (c *Client) DeleteVolumeSnapshot(ctx context.Context, name, ref string) error {
	if err := checkVolumeName(name); err != nil {
		return err
	}
	if err := checkVolumeName(ref); err != nil {
		return err
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(name)+"/snapshots/"+url.PathEscape(ref), nil, nil, nil, nil)
	return err
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
