package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
)

// LocationsBucket is the JetStream KV bucket of the fleet's directory:
// one key per session or snapshot ("session.ID", "snapshot.ID"), its
// value the Location record (JSON) saying which host holds it.
const LocationsBucket = "forkbox-locations"

// Kind is what a Location locates.
type Kind string

const (
	// KindSession locates a session.
	KindSession Kind = "session"
	// KindSnapshot locates a snapshot.
	KindSnapshot Kind = "snapshot"
)

// Location states. A live entry has State "".
const (
	// LocationTerminated is a session the fleet gave up on: its host
	// was lost (Reason ReasonHostLost). Callers get 410
	// session-terminated; the host destroys it when it comes back.
	LocationTerminated = "terminated"
)

// ReasonHostLost is the Reason of a session whose host's heartbeat has
// been missing for longer than the registry's LostAfter.
const ReasonHostLost = "host-lost"

// Location is where one session or snapshot of the fleet lives.
type Location struct {
	// Kind is KindSession or KindSnapshot.
	Kind Kind `json:"kind"`
	// ID is the session's or snapshot's id (node.ValidID's shape).
	ID string `json:"id"`
	// Host is the id of the host that holds it.
	Host string `json:"host"`
	// Tenant is its tenant ("" for the default tenant).
	Tenant string `json:"tenant,omitempty"`
	// State is "" while it lives, LocationTerminated once the fleet
	// gave up on it.
	State string `json:"state,omitempty"`
	// Reason says why it was terminated (ReasonHostLost).
	Reason string `json:"reason,omitempty"`
	// Replicated (snapshots) reports whether a copy is in the fleet's
	// object store, so another host can restore it.
	Replicated bool `json:"replicated,omitempty"`
	// Digest (snapshots) is the digest of the replicated copy's
	// manifest ("sha256:HEX"), checked by the host that pulls it.
	Digest string `json:"digest,omitempty"`
	// Updated is when the entry was last written, by the JetStream
	// server's clock. Set by Get and List.
	Updated time.Time `json:"-"`
	// Revision is the entry's KV revision (Get and List); Update
	// writes only over this revision.
	Revision uint64 `json:"-"`
}

// locationID is what a located id may be: a session or snapshot id
// (20 of [a-z0-9]) or a longer name-safe token; it is a KV key part.
var locationID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,127}$`)

func locationKey(kind Kind, id string) (string, error) {
	if kind != KindSession && kind != KindSnapshot {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "location kind %q: want session or snapshot", kind)
	}
	if !locationID.MatchString(id) {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "%s id %q: not an id", kind, id)
	}
	return string(kind) + "." + id, nil
}

// Directory is the fleet's directory of sessions and snapshots: which
// host holds each. Every host writes the entries of what it holds;
// any host reads them to route a call. Safe for concurrent use.
type Directory struct {
	kv jetstream.KeyValue
	// node is the name of this host's embedded NATS server ("" with an
	// external NATS): its replica is the one whose lag matters most
	// (awaitReplicas).
	node string
}

// OpenDirectory opens (creating when missing) the directory's bucket on
// f, replicated f.Replicas() times, waiting up to ctx for a cluster
// still electing its leaders.
func OpenDirectory(ctx context.Context, f *Fleet) (*Directory, error) {
	var kv jetstream.KeyValue
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		kv, err = f.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: LocationsBucket, Description: "forkbox directory: the host of each session and snapshot",
			History: 1, Replicas: f.replicas, Storage: jetstream.FileStorage,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: directory: %w", err)
	}
	d := &Directory{kv: kv}
	if f.srv != nil {
		d.node = f.opts.NodeID
	}
	return d, nil
}

// Put writes l (a bad kind or id is ErrInvalidArgument). The error is
// ErrUnavailable when the bucket cannot be written (no quorum).
func (d *Directory) Put(ctx context.Context, l Location) error {
	key, err := locationKey(l.Kind, l.ID)
	if err != nil {
		return err
	}
	if err := ValidID("host id", l.Host); err != nil {
		return err
	}
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if _, err := d.kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("%w: fleet: write %s: %v", errdefs.ErrUnavailable, key, err)
	}
	return nil
}

// Update writes l only if its entry is still at l.Revision (as Get or
// List returned it): a compare-and-set. Another write in between is
// ErrConflict; the caller reads again and decides.
func (d *Directory) Update(ctx context.Context, l Location) error {
	key, err := locationKey(l.Kind, l.ID)
	if err != nil {
		return err
	}
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if _, err := d.kv.Update(ctx, key, b, l.Revision); err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return errdefs.Newf(errdefs.ErrConflict, "%s %s changed since it was read", l.Kind, l.ID)
		}
		return fmt.Errorf("%w: fleet: update %s: %v", errdefs.ErrUnavailable, key, err)
	}
	return nil
}

// Get returns the entry of kind's id: ErrNotFound when the directory has
// none, ErrUnavailable when it cannot be read.
func (d *Directory) Get(ctx context.Context, kind Kind, id string) (Location, error) {
	key, err := locationKey(kind, id)
	if err != nil {
		return Location{}, err
	}
	e, err := d.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Location{}, errdefs.Newf(errdefs.ErrNotFound, "%s %s is in no host's directory entry", kind, id)
	}
	if err != nil {
		return Location{}, fmt.Errorf("%w: fleet: read %s: %v", errdefs.ErrUnavailable, key, err)
	}
	return decodeLocation(e)
}

func decodeLocation(e jetstream.KeyValueEntry) (Location, error) {
	var l Location
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return Location{}, fmt.Errorf("fleet: directory entry %s: %w", e.Key(), err)
	}
	l.Updated, l.Revision = e.Created(), e.Revision()
	return l, nil
}

// Delete removes kind's id's entry; a missing one is fine.
func (d *Directory) Delete(ctx context.Context, kind Kind, id string) error {
	key, err := locationKey(kind, id)
	if err != nil {
		return err
	}
	if err := d.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("%w: fleet: delete %s: %v", errdefs.ErrUnavailable, key, err)
	}
	return nil
}

// List returns every entry of kind ("" for both) that keep accepts (nil
// keeps all), in no set order. Unreadable entries are skipped.
func (d *Directory) List(ctx context.Context, kind Kind, keep func(Location) bool) ([]Location, error) {
	filter := ">"
	if kind != "" {
		filter = string(kind) + ".>"
	}
	w, err := d.kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("%w: fleet: list the directory: %v", errdefs.ErrUnavailable, err)
	}
	defer w.Stop()
	var out []Location
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			l, err := decodeLocation(e)
			if err == nil && (keep == nil || keep(l)) {
				out = append(out, l)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: fleet: list the directory: %v", errdefs.ErrUnavailable, ctx.Err())
		}
	}
}

// MarkHostLost marks every live session entry of host terminated with
// ReasonHostLost (each by compare-and-set, so an entry its host rewrote
// meanwhile is left alone) and returns the sessions it marked.
// Snapshots are not marked: a replicated one still restores elsewhere.
func (d *Directory) MarkHostLost(ctx context.Context, host string) ([]Location, error) {
	ls, err := d.List(ctx, KindSession, func(l Location) bool { return l.Host == host && l.State == "" })
	if err != nil {
		return nil, err
	}
	var marked []Location
	for _, l := range ls {
		l.State, l.Reason = LocationTerminated, ReasonHostLost
		if err := d.Update(ctx, l); err != nil {
			if errors.Is(err, errdefs.ErrConflict) {
				continue
			}
			return marked, err
		}
		marked = append(marked, l)
	}
	return marked, nil
}

// Claim writes l only when kind's id has no entry yet (a snapshot's
// entry another host wrote, say, is never overwritten: an imported copy
// of it is not where it lives). It reports whether it wrote.
func (d *Directory) Claim(ctx context.Context, l Location) (bool, error) {
	key, err := locationKey(l.Kind, l.ID)
	if err != nil {
		return false, err
	}
	if err := ValidID("host id", l.Host); err != nil {
		return false, err
	}
	b, err := json.Marshal(l)
	if err != nil {
		return false, err
	}
	if _, err := d.kv.Create(ctx, key, b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return false, nil
		}
		return false, fmt.Errorf("%w: fleet: write %s: %v", errdefs.ErrUnavailable, key, err)
	}
	return true, nil
}

// DeleteOwned removes kind's id's entry only while it names host (by
// compare-and-set on the entry read): a host deleting its copy of
// another host's snapshot leaves that host's entry. A missing entry, or
// one of another host, is fine.
func (d *Directory) DeleteOwned(ctx context.Context, kind Kind, id, host string) error {
	l, err := d.Get(ctx, kind, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if l.Host != host {
		return nil
	}
	key, _ := locationKey(kind, id)
	if err := d.kv.Delete(ctx, key, jetstream.LastRevision(l.Revision)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return errdefs.Newf(errdefs.ErrConflict, "%s %s changed since it was read", kind, id)
		}
		return fmt.Errorf("%w: fleet: delete %s: %v", errdefs.ErrUnavailable, key, err)
	}
	return nil
}
