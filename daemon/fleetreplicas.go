package daemon

import (
	"context"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
)

// openCache opens the bounded cache of pulled snapshots
// (FleetOptions.CacheMB) in layout's fleet directory.
func (fh *fleetHost) openCache(opts FleetOptions, layout datadir.Layout) error {
	mb := opts.CacheMB
	if mb == 0 {
		mb = DefaultSnapshotCacheMB
	}
	if mb < 0 {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "--snapshot-cache-mb %d: must be at least 1", mb)
	}
	c, err := fleet.OpenCache(layout.FleetCache(), int64(mb)<<20, lazyObjects{fh})
	if err != nil {
		return err
	}
	fh.cache = c
	return nil
}

// lazyObjects is the object store once open (fleet.Objects;
// ErrUnavailable before).
type lazyObjects struct{ fh *fleetHost }

var _ fleet.Objects = lazyObjects{}

func (l lazyObjects) objects() (*fleet.JetStreamObjects, error) {
	if o := l.fh.objects.Load(); o != nil {
		return o, nil
	}
	return nil, errdefs.Newf(errdefs.ErrUnavailable, "the fleet's object store is not available yet")
}

// Put implements fleet.Objects.
func (l lazyObjects) Put(ctx context.Context, id, dir, digest string) error {
	o, err := l.objects()
	if err != nil {
		return err
	}
	return o.Put(ctx, id, dir, digest)
}

// Get implements fleet.Objects.
func (l lazyObjects) Get(ctx context.Context, id, digest, dst string) error {
	o, err := l.objects()
	if err != nil {
		return err
	}
	return o.Get(ctx, id, digest, dst)
}

// Delete implements fleet.Objects.
func (l lazyObjects) Delete(ctx context.Context, id string) error {
	o, err := l.objects()
	if err != nil {
		return err
	}
	return o.Delete(ctx, id)
}
