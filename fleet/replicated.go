package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
)

// FilesObjectID is the object store id of snapshot id's files export (a
// sealed directory: the change archive of its files and its record); its
// memory checkpoint, when it has one, is stored under id itself.
func FilesObjectID(id string) string { return id + "-files" }

// SetReplicated records in the directory that snapshot l.ID's copy in the
// object store is complete: its entry gets Replicated and l.Digest, and
// keeps what else it says (another writer's fields, such as its
// creation's, are not lost: a compare-and-set, read again on a
// conflict). When there is no entry yet, l is created as given (Kind
// KindSnapshot, Host, Tenant). The host of an existing entry must be
// l.Host: a host records only the copies of its own snapshots
// (ErrConflict otherwise).
func (d *Directory) SetReplicated(ctx context.Context, l Location) error {
	l.Kind, l.Replicated = KindSnapshot, true
	key, err := locationKey(l.Kind, l.ID)
	if err != nil {
		return err
	}
	if err := ValidID("host id", l.Host); err != nil {
		return err
	}
	for attempt := 0; attempt < 8; attempt++ {
		cur, err := d.Get(ctx, KindSnapshot, l.ID)
		if errors.Is(err, errdefs.ErrNotFound) {
			b, err := json.Marshal(l)
			if err != nil {
				return err
			}
			_, err = d.kv.Create(ctx, key, b)
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // written meanwhile: update that
			}
			if err != nil {
				return fmt.Errorf("%w: fleet: write %s: %v", errdefs.ErrUnavailable, key, err)
			}
			return nil
		}
		if err != nil {
			return err
		}
		if cur.Host != l.Host {
			return errdefs.Newf(errdefs.ErrConflict, "snapshot %s is host %s's, not %s's", l.ID, cur.Host, l.Host)
		}
		cur.Replicated, cur.Digest = true, l.Digest
		if cur.Tenant == "" {
			cur.Tenant = l.Tenant
		}
		err = d.Update(ctx, cur)
		if errors.Is(err, errdefs.ErrConflict) {
			continue
		}
		return err
	}
	return errdefs.Newf(errdefs.ErrConflict, "snapshot %s: its directory entry kept changing", l.ID)
}
