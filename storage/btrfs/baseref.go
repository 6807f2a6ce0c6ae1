package btrfs

import (
	"sync"

	"golang.org/x/sys/unix"
)

// baseRefs remembers the referenced bytes of read-only source subvolumes
// (snapshots, templates) that Prepare read once, so that the layers made
// from one source later do not each commit a btrfs transaction to read a
// number that cannot change: a read-only subvolume's tree is fixed (the
// driver makes a subvolume writable again only to destroy it), and after
// the first commit since it became read-only its qgroup counts are final.
// Keys carry the subvolume id, which btrfs never reuses, so a source
// removed and made again under the same path is read afresh.
type baseRefs struct {
	mu sync.Mutex
	m  map[baseRefKey]int64
}

// baseRefKey names one subvolume: its path and its id.
type baseRefKey struct {
	path string
	id   uint64
}

// maxBaseRefs bounds the cache; when full it is emptied (each entry costs
// one transaction commit to read again).
const maxBaseRefs = 4096

// baseReferenced returns the referenced bytes of source subvolume src,
// from the cache when src is read-only and was read before, else by
// usageBytes (a transaction commit), caching the answer when src is
// read-only.
func (d *Driver) baseReferenced(src string) (int64, error) {
	key, ro := readOnlyKey(src)
	if ro {
		d.refs.mu.Lock()
		n, ok := d.refs.m[key]
		d.refs.mu.Unlock()
		if ok {
			return n, nil
		}
	}
	u, err := d.usageBytes(src, false)
	if err != nil {
		return 0, err
	}
	if ro {
		d.refs.mu.Lock()
		if d.refs.m == nil || len(d.refs.m) >= maxBaseRefs {
			d.refs.m = make(map[baseRefKey]int64)
		}
		d.refs.m[key] = u.Referenced
		d.refs.mu.Unlock()
	}
	return u.Referenced, nil
}

// readOnlyKey returns src's cache key and whether src is a read-only
// subvolume (false on any error: the caller then reads the usage afresh).
func readOnlyKey(src string) (baseRefKey, bool) {
	fd, err := openDir(src)
	if err != nil {
		return baseRefKey{}, false
	}
	defer unix.Close(fd)
	flags, err := subvolumeFlags(fd)
	if err != nil || flags&subvolReadOnly == 0 {
		return baseRefKey{}, false
	}
	id, err := subvolumeID(fd)
	if err != nil {
		return baseRefKey{}, false
	}
	return baseRefKey{path: src, id: id}, true
}
