package fleet

import (
	"context"
	"errors"
	"log/slog"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// SnapshotReplicas is one host's side of its snapshots in the fleet: it
// copies them into the object store and records them replicated in the
// directory, locates and pulls (through the bounded cache, verified)
// other hosts' snapshots, and deletes what the fleet holds of a snapshot
// its host deletes. It is the snapshot service's snapshot.Replicas.
type SnapshotReplicas struct {
	// Self is this host's id.
	Self string
	// Objects is the object store (its calls may be ErrUnavailable while
	// a cluster has no quorum).
	Objects Objects
	// Directory returns the fleet's directory, or ErrUnavailable.
	Directory func() (*Directory, error)
	// Cache holds the copies of other hosts' snapshots pulled here.
	Cache *Cache
	// Log is where failures that do not fail a call are logged.
	Log *slog.Logger
}

// Put copies the sealed memory checkpoint directory dir (manifest digest
// digest) as snapshot id's objects.
func (r *SnapshotReplicas) Put(ctx context.Context, id, dir, digest string) error {
	return r.Objects.Put(ctx, id, dir, digest)
}

// PutFiles copies snapshot sn's sealed files export dir (manifest digest
// digest) as the objects of FilesObjectID(sn.ID), then records sn
// replicated with that digest in the directory (SetReplicated).
func (r *SnapshotReplicas) PutFiles(ctx context.Context, sn *node.Snapshot, dir, digest string) error {
	if err := r.Objects.Put(ctx, FilesObjectID(sn.ID), dir, digest); err != nil {
		return err
	}
	d, err := r.Directory()
	if err != nil {
		return err
	}
	return d.SetReplicated(ctx, Location{ID: sn.ID, Host: r.Self, Tenant: sn.Tenant, Digest: digest})
}

// Delete drops the cache's copies of snapshot id; when id is this host's
// own (its directory entry names this host, or there is none) its
// objects (memory checkpoint and files export) and its directory entry
// go too. Another host's snapshot, imported here, keeps its fleet copy.
func (r *SnapshotReplicas) Delete(ctx context.Context, id string) error {
	for _, cid := range []string{id, FilesObjectID(id)} {
		if err := r.Cache.Remove(cid); err != nil && r.Log != nil {
			r.Log.Warn("fleet: drop a deleted snapshot from the cache", "snapshot", id, "err", err)
		}
	}
	d, err := r.Directory()
	if err != nil {
		return err
	}
	l, err := d.Get(ctx, KindSnapshot, id)
	if err == nil && l.Host != r.Self {
		return nil
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if err := r.Objects.Delete(ctx, id); err != nil {
		return err
	}
	if err := r.Objects.Delete(ctx, FilesObjectID(id)); err != nil {
		return err
	}
	return d.Delete(ctx, KindSnapshot, id)
}

// Replicated reports whether the directory says snapshot id is copied:
// its entry is this host's and replicated, or it is another host's (an
// import: nothing for this host to copy). No entry is false.
func (r *SnapshotReplicas) Replicated(ctx context.Context, id string) (bool, error) {
	d, err := r.Directory()
	if err != nil {
		return false, err
	}
	l, err := d.Get(ctx, KindSnapshot, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return l.Host != r.Self || l.Replicated && l.Digest != "", nil
}

// Locate returns snapshot id's tenant and files export digest when the
// directory says another host's snapshot id is replicated and live;
// ErrNotFound otherwise.
func (r *SnapshotReplicas) Locate(ctx context.Context, id string) (tenant, digest string, err error) {
	d, err := r.Directory()
	if err != nil {
		return "", "", err
	}
	l, err := d.Get(ctx, KindSnapshot, id)
	if err != nil {
		return "", "", err
	}
	if !l.Replicated || l.Digest == "" || l.State != "" || l.Host == r.Self {
		return "", "", errdefs.Newf(errdefs.ErrNotFound, "snapshot %q has no replicated copy in the fleet", id)
	}
	return l.Tenant, l.Digest, nil
}

// OpenFiles returns snapshot id's files export from the cache, pulled
// when missing and verified against digest (Cache.Open).
func (r *SnapshotReplicas) OpenFiles(ctx context.Context, id, digest string) (string, func(), error) {
	return r.Cache.Open(ctx, FilesObjectID(id), digest)
}

// OpenMemory returns snapshot id's sealed memory checkpoint from the
// cache, pulled when missing and verified against digest (Cache.Open).
func (r *SnapshotReplicas) OpenMemory(ctx context.Context, id, digest string) (string, func(), error) {
	return r.Cache.Open(ctx, id, digest)
}
