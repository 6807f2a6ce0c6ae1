package volume

import (
	"context"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// API is the node.Volumes of a host: the service's calls for the tenant
// of each request (package tenancy; the default tenant when none).
type API struct{ s *Service }

// NewAPI returns the node.Volumes over s (nil: a host without volumes,
// whose calls are ErrUnavailable).
func NewAPI(s *Service) *API { return &API{s: s} }

var _ node.Volumes = (*API)(nil)

func tenantOf(ctx context.Context) string { return tenancy.TenantOf(ctx, store.DefaultTenant) }

// errNoVolumes answers every call of a host without volumes.
var errNoVolumes = errdefs.Newf(errdefs.ErrUnavailable, "this daemon has no volumes")

// CreateVolume is Service.Create for the caller's tenant.
func (a *API) CreateVolume(ctx context.Context, name string, sizeMB int64, from string) (*node.Volume, error) {
	if a.s == nil {
		return nil, errNoVolumes
	}
	return a.s.Create(ctx, tenantOf(ctx), name, sizeMB, from)
}

// ListVolumes is Service.List for the caller's tenant.
func (a *API) ListVolumes(ctx context.Context) ([]*node.Volume, error) {
	if a.s == nil {
		return nil, errNoVolumes
	}
	return a.s.List(ctx, tenantOf(ctx))
}

// GetVolume is Service.Get for the caller's tenant.
func (a *API) GetVolume(ctx context.Context, name string) (*node.Volume, error) {
	if a.s == nil {
		return nil, errNoVolumes
	}
	return a.s.Get(ctx, tenantOf(ctx), name)
}

// DeleteVolume is Service.Remove for the caller's tenant.
func (a *API) DeleteVolume(ctx context.Context, name string) error {
	if a.s == nil {
		return errNoVolumes
	}
	return a.s.Remove(ctx, tenantOf(ctx), name)
}

// SnapshotVolume is Service.Snapshot for the caller's tenant.
func (a *API) SnapshotVolume(ctx context.Context, name, snapName string) (*node.VolumeSnapshot, error) {
	if a.s == nil {
		return nil, errNoVolumes
	}
	return a.s.Snapshot(ctx, tenantOf(ctx), name, snapName)
}

// ListVolumeSnapshots is Service.ListSnapshots for the caller's tenant.
func (a *API) ListVolumeSnapshots(ctx context.Context, name string) ([]*node.VolumeSnapshot, error) {
	if a.s == nil {
		return nil, errNoVolumes
	}
	return a.s.ListSnapshots(ctx, tenantOf(ctx), name)
}

// DeleteVolumeSnapshot is Service.DeleteSnapshot for the caller's tenant.
func (a *API) DeleteVolumeSnapshot(ctx context.Context, name, ref string) error {
	if a.s == nil {
		return errNoVolumes
	}
	return a.s.DeleteSnapshot(ctx, tenantOf(ctx), name, ref)
}
