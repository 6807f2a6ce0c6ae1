package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
)

// DrainsBucket is the JetStream KV bucket of drain requests: one key per
// host being drained, its value a drainRecord. Any host writes it (the
// drain request may reach any host's API); the drained host reads its own
// key every heartbeat and writes its record draining, and List reads the
// bucket so that placements skip the host at once.
const DrainsBucket = "forkbox-host-drains"

// drainRecord is a drain request.
type drainRecord struct {
	// Since is when the drain was asked for.
	Since time.Time `json:"since"`
}

func openDrains(ctx context.Context, f *Fleet) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		kv, err = f.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: DrainsBucket, Description: "forkbox hosts being drained: no placements there",
			History: 1, Replicas: f.replicas, Storage: jetstream.FileStorage,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: drain requests: %w", err)
	}
	return kv, nil
}

// Drain sets (on) or clears host id's drain flag. A drained host takes no
// placements (List reports it HostDraining, not Placeable) and its
// sessions run on until they end or are moved; clearing the flag makes it
// ready again. An id not in the registry is ErrNotFound; a bucket that
// cannot be written is ErrUnavailable. Setting a set flag or clearing a
// clear one is fine.
func (r *Registry) Drain(ctx context.Context, id string, on bool) error {
	if err := ValidID("host id", id); err != nil {
		return err
	}
	if _, err := r.kv.Get(ctx, id); errors.Is(err, jetstream.ErrKeyNotFound) {
		return errdefs.Newf(errdefs.ErrNotFound, "host %s is not in the fleet's registry", id)
	} else if err != nil {
		return fmt.Errorf("%w: fleet: read host %s: %v", errdefs.ErrUnavailable, id, err)
	}
	if !on {
		if err := r.drains.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("%w: fleet: undrain host %s: %v", errdefs.ErrUnavailable, id, err)
		}
		return nil
	}
	if e, err := r.drains.Get(ctx, id); err == nil && e.Operation() == jetstream.KeyValuePut {
		return nil // already draining: keep its Since
	}
	b, err := json.Marshal(drainRecord{Since: time.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := r.drains.Put(ctx, id, b); err != nil {
		return fmt.Errorf("%w: fleet: drain host %s: %v", errdefs.ErrUnavailable, id, err)
	}
	return nil
}

// drainFlag reports whether host id's drain flag is set, reading it now;
// when it cannot be read it reports the value last read, so a host cut off
// from the quorum neither starts nor stops draining by itself.
func (r *Registry) drainFlag(ctx context.Context, id string) bool {
	_, err := r.drains.Get(ctx, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		r.draining = true
	case errors.Is(err, jetstream.ErrKeyNotFound):
		r.draining = false
	}
	return r.draining
}

// drainFlags returns the ids of the hosts whose drain flag is set (one
// pass over the bucket); ErrUnavailable when it cannot be read.
func (r *Registry) drainFlags(ctx context.Context) (map[string]bool, error) {
	w, err := r.drains.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("%w: fleet: list drained hosts: %v", errdefs.ErrUnavailable, err)
	}
	defer w.Stop()
	out := map[string]bool{}
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			out[e.Key()] = true
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: fleet: list drained hosts: %v", errdefs.ErrUnavailable, ctx.Err())
		}
	}
}
