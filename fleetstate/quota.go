package fleetstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/keyed"
)

// QuotaBucket is the KV bucket of the fleet's quota counts: key
// "WHAT.TENANT" (what: "sessions", "snapshots", or "cpu-YYYY-MM-DD": the
// CPU-milliseconds used on that UTC day), value a quotaEntry, the count
// each host holds.
const QuotaBucket = "forkbox-quotas"

// quotaEntry is one value of QuotaBucket.
type quotaEntry struct {
	// Hosts is each host's count, by host id; a host with none is left
	// out.
	Hosts map[string]int `json:"hosts"`
}

func (e quotaEntry) total() int {
	n := 0
	for _, c := range e.Hosts {
		n += c
	}
	return n
}

// Quotas keeps a tenant's counts across the fleet: for each quota
// (sessions, snapshots) and tenant, every host's own count, so a host
// admits one more only while the fleet's sum stays within the tenant's
// limit. Every write is a compare-and-set on the entry's revision, so two
// hosts admitting at once cannot both take the last place. A host
// always writes its own count as it counts it locally (never an
// increment), and Reconcile rewrites them and drops those of hosts the
// registry reports lost, so a crash never holds a place for ever. Safe
// for concurrent use.
type Quotas struct {
	kv   jetstream.KeyValue
	host string
	log  *slog.Logger
	// locks serialise this host's reads and writes of one entry (its
	// own count must be read and written as one step).
	locks keyed.Mutex
}

// OpenQuotas opens (creating when missing) QuotaBucket on f, waiting up
// to ctx for a cluster without a quorum yet.
func OpenQuotas(ctx context.Context, f *fleet.Fleet, log *slog.Logger) (*Quotas, error) {
	kv, err := f.KeyValue(ctx, QuotaBucket, "forkbox quota counts: each host's count of a tenant's sessions and snapshots", 1)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Quotas{kv: kv, host: f.NodeID(), log: log}, nil
}

// casAttempts bounds the compare-and-set rounds of one write; each
// conflict means another host wrote the entry meanwhile.
const casAttempts = 50

// Hold sets this host's count of what for tenant to mine() (called once
// the entry is read, under a lock of this host's for the entry, so it
// counts what this host holds at the moment of the write). When max is
// above zero and this host's count grows, the fleet's sum with it may be
// at most max: past that nothing is written and the error is
// ErrResourceExhausted (saying the sum). Once written, held (nil: none)
// runs, still under the lock, for the caller to count what it now holds
// (so the next mine() includes it). ErrUnavailable when the bucket
// cannot be read or written (no quorum); ErrConflict after too many
// writes by other hosts in between. It returns the fleet's sum as
// written.
func (q *Quotas) Hold(ctx context.Context, what, tenant string, max int, mine func() int, held func()) (int, error) {
	key, err := quotaKey(what, tenant)
	if err != nil {
		return 0, err
	}
	defer q.locks.Lock(key)()
	n, err := q.hold(ctx, key, tenant, what, max, mine)
	if err == nil && held != nil {
		held()
	}
	return n, err
}

func (q *Quotas) hold(ctx context.Context, key, tenant, what string, max int, mine func() int) (int, error) {
	return q.write(ctx, key, func(e *quotaEntry) (bool, error) {
		n, old := mine(), e.Hosts[q.host]
		if n == old {
			return false, nil
		}
		if max > 0 && n > old && e.total()-old+n > max {
			return false, errdefs.Newf(errdefs.ErrResourceExhausted, "tenant %s has %d %s over the fleet, its limit is %d",
				tenant, e.total(), what, max)
		}
		setCount(e, q.host, n)
		return true, nil
	})
}

// Sync sets this host's count of what for tenant to mine() without any
// limit (after a session ended or a create failed). An entry that does
// not exist is not made for a count of zero. Errors are as Hold's.
func (q *Quotas) Sync(ctx context.Context, what, tenant string, mine func() int) error {
	_, err := q.Hold(ctx, what, tenant, 0, mine, nil)
	return err
}

func setCount(e *quotaEntry, host string, n int) {
	if n <= 0 {
		delete(e.Hosts, host)
		return
	}
	e.Hosts[host] = n
}

// write reads key's entry, lets change edit it (false: nothing to write)
// and writes it over the revision read, again while another host wrote
// in between. It returns the entry's sum.
func (q *Quotas) write(ctx context.Context, key string, change func(*quotaEntry) (bool, error)) (int, error) {
	for range casAttempts {
		e := quotaEntry{Hosts: map[string]int{}}
		var rev uint64
		kve, err := q.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return 0, fmt.Errorf("%w: fleet quota %s: %v", errdefs.ErrUnavailable, key, err)
		default:
			rev = kve.Revision()
			if err := json.Unmarshal(kve.Value(), &e); err != nil || e.Hosts == nil {
				e = quotaEntry{Hosts: map[string]int{}}
			}
		}
		ok, err := change(&e)
		if err != nil || !ok {
			return e.total(), err
		}
		b, err := json.Marshal(e)
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			_, err = q.kv.Create(ctx, key, b)
		} else {
			_, err = q.kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return e.total(), nil
		}
		if !casConflict(err) {
			return 0, fmt.Errorf("%w: fleet quota %s: %v", errdefs.ErrUnavailable, key, err)
		}
		// Another host wrote first: read again, after a moment so that
		// hosts racing for one entry spread out.
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: fleet quota %s: %v", errdefs.ErrUnavailable, key, ctx.Err())
		case <-time.After(time.Duration(rand.IntN(5)+1) * time.Millisecond):
		}
	}
	return 0, errdefs.Newf(errdefs.ErrConflict, "fleet quota %s: written by other hosts %d times while this host tried", key, casAttempts)
}

// casConflict reports whether err is a compare-and-set that lost: the
// entry was written (or made) by another host since it was read.
func casConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// quotaWhat is what a quota may count.
var quotaWhat = regexp.MustCompile(`^(sessions|snapshots|cpu-\d{4}-\d{2}-\d{2})$`)

// cpuDays is how long a day's CPU counts stay in the bucket (Reconcile
// deletes older ones): today and yesterday, for hosts whose clocks
// disagree around midnight.
const cpuDays = 2

func quotaKey(what, tenant string) (string, error) {
	if !quotaWhat.MatchString(what) {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "fleet quota %q: want sessions, snapshots or cpu-DAY", what)
	}
	if !kvName.MatchString(tenant) {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "fleet quota of tenant %q: not a tenant name", tenant)
	}
	return what + "." + tenant, nil
}

// Counts returns the fleet's sum of what for tenant and each host's
// count (for GET /v1/tenants and tests). ErrUnavailable when the bucket
// cannot be read.
func (q *Quotas) Counts(ctx context.Context, what, tenant string) (int, map[string]int, error) {
	key, err := quotaKey(what, tenant)
	if err != nil {
		return 0, nil, err
	}
	kve, err := q.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, map[string]int{}, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("%w: fleet quota %s: %v", errdefs.ErrUnavailable, key, err)
	}
	var e quotaEntry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return 0, nil, fmt.Errorf("fleet quota %s: %w", key, err)
	}
	return e.total(), maps.Clone(e.Hosts), nil
}

// Reconcile rewrites every entry: this host's count becomes local(what,
// tenant) (what it holds now), and the counts of hosts live does not
// report (lost ones; live nil keeps every host) are dropped, so neither
// a crash here nor a lost host holds places for ever. A failed entry is
// logged and the others are still done; the error is the listing's.
func (q *Quotas) Reconcile(ctx context.Context, local func(what, tenant string) int, live map[string]bool) error {
	keys, err := q.kv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("%w: fleet quotas: %v", errdefs.ErrUnavailable, err)
	}
	defer keys.Stop()
	var all []string
	for k := range keys.Keys() {
		all = append(all, k)
	}
	for _, key := range all {
		what, tenant, ok := strings.Cut(key, ".")
		if !ok {
			continue
		}
		if day, isCPU := strings.CutPrefix(what, "cpu-"); isCPU {
			if d, err := time.Parse(time.DateOnly, day); err == nil && time.Since(d) > cpuDays*24*time.Hour {
				if err := q.kv.Delete(ctx, key); err != nil && ctx.Err() == nil {
					q.log.Warn("fleet: an old day's CPU count not deleted", "key", key, "err", err)
				}
				continue
			}
		}
		unlock := q.locks.Lock(key)
		_, err := q.write(ctx, key, func(e *quotaEntry) (bool, error) {
			changed := false
			for h := range e.Hosts {
				if h != q.host && live != nil && !live[h] {
					delete(e.Hosts, h)
					changed = true
				}
			}
			if n := local(what, tenant); n != e.Hosts[q.host] {
				setCount(e, q.host, n)
				changed = true
			}
			return changed, nil
		})
		unlock()
		if err != nil && ctx.Err() == nil {
			q.log.Warn("fleet: quota count not reconciled", "key", key, "err", err)
		}
	}
	return nil
}
