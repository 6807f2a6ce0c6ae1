package sandbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
)

// Egress bounds of a session's network.
const (
	// MaxEgressBytes bounds what a request may ask: 1 TiB.
	MaxEgressBytes = 1 << 40
	// MaxConnectionsPerMinute bounds what a request may ask.
	MaxConnectionsPerMinute = 60000
)

// normalizeNetwork checks a create request's network and fills its
// defaults. ErrInvalidArgument naming network.* fields.
func normalizeNetwork(n *node.Network) error {
	if n == nil {
		return nil
	}
	if len(n.Allow) == 0 {
		return errdefs.InvalidField("network.allow", "must list at least one destination (omit network for none)")
	}
	if _, err := netpolicy.ParseAllow("network.allow", n.Allow); err != nil {
		return err
	}
	if n.MaxEgressBytes == 0 {
		n.MaxEgressBytes = defaults.EgressBytes
	}
	if n.MaxEgressBytes < 0 || n.MaxEgressBytes > MaxEgressBytes {
		return errdefs.InvalidField("network.max_egress_bytes", "must be between 1 and %d", int64(MaxEgressBytes))
	}
	if n.MaxConnectionsPerMinute == 0 {
		n.MaxConnectionsPerMinute = defaults.ConnectionsPerMinute
	}
	if n.MaxConnectionsPerMinute < 0 || n.MaxConnectionsPerMinute > MaxConnectionsPerMinute {
		return errdefs.InvalidField("network.max_connections_per_minute", "must be between 1 and %d", MaxConnectionsPerMinute)
	}
	return nil
}

// copyNetwork is a deep copy of n (nil for none), so that a record never
// shares the caller's slice.
func copyNetwork(n *node.Network) *node.Network {
	if n == nil {
		return nil
	}
	return &node.Network{Allow: append([]string(nil), n.Allow...), MaxEgressBytes: n.MaxEgressBytes,
		MaxConnectionsPerMinute: n.MaxConnectionsPerMinute, Secrets: append([]string(nil), n.Secrets...)}
}

// policyOf turns a stored network into the egress policy.
func policyOf(n *node.Network) (*netpolicy.Policy, error) {
	rules, err := netpolicy.ParseAllow("network.allow", n.Allow)
	if err != nil {
		return nil, err
	}
	return &netpolicy.Policy{Allow: rules, MaxBytes: n.MaxEgressBytes, MaxConnsPerMinute: n.MaxConnectionsPerMinute}, nil
}

// attachNetwork gives sb its network (adopt: the one it had before a
// daemon restart). nil when sb has no network. makeNetns, when not nil,
// makes the network namespace file (see netpolicy.Service.Attach).
func (hr *hostResources) attachNetwork(sb *Sandbox, adopt bool, makeNetns func(path string) error) (*netpolicy.Attachment, error) {
	n := sb.Record().Network
	if n == nil {
		return nil, nil
	}
	if hr.m.opts.Net == nil {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "session %s has a network, but this daemon has no egress service", sb.id)
	}
	p, err := policyOf(n)
	if err != nil {
		return nil, err
	}
	sink := hr.m.meter.egressSink(sb.id, sb.Record().Tenant)
	if adopt {
		used, err := hr.m.opts.Store.EgressBytes(context.Background(), sb.id)
		if err != nil {
			return nil, err
		}
		att, err := hr.m.opts.Net.Adopt(sb.id, p, sink, used)
		if err != nil {
			return nil, err
		}
		hr.m.restoreSecrets(sb)
		return att, nil
	}
	return hr.m.opts.Net.Attach(sb.id, p, sink, makeNetns)
}

// EgressRetention is how long egress records are kept (the janitor
// deletes older ones): 30 days.
const EgressRetention = 30 * 24 * time.Hour

// MaxEgressRecords bounds the egress records kept per session. Past it,
// only records of connections that moved bytes are kept (they are the
// session's byte accounting); DNS queries and refusals are not.
const MaxEgressRecords = 100_000

// retryNetwork starts an adopted sandbox's egress service once it can
// (its ports were still held by the previous daemon), trying every second
// until it succeeds, the sandbox ends or the manager closes.
func (hr *hostResources) retryNetwork(sb *Sandbox) {
	defer hr.m.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for attempt := 1; ; attempt++ {
		select {
		case <-hr.m.closing:
			return
		case <-sb.done:
			return
		case <-t.C:
		}
		att, err := hr.attachNetwork(sb, true, nil)
		if err == nil {
			sb.mu.Lock()
			ending := sb.tearing
			if !ending {
				sb.net = att
			}
			sb.mu.Unlock()
			if ending {
				_ = hr.m.opts.Net.Detach(sb.id)
			}
			hr.m.log.Info("egress service started", "session", sb.id, "attempts", attempt)
			return
		}
		if attempt%30 == 0 {
			hr.m.log.Warn("egress service still not started", "session", sb.id, "err", err)
		}
	}
}

// egressSink records session id's egress events through the manager's
// recorder (see recordEgress). Records that carry bytes wait up to 2 s for
// room in the queue; the others are dropped when it is full, and past
// MaxEgressRecords for the session.
func (mt *Meter) egressSink(id, tenant string) netpolicy.Sink {
	stored, err := mt.m.opts.Store.CountEgress(context.Background(), id)
	if err != nil {
		mt.m.log.Warn("count egress records", "session", id, "err", err)
	}
	var count atomic.Int64
	count.Store(stored)
	return func(ev netpolicy.Event) {
		denied := ev.Decision == netpolicy.DecisionDeny
		mt.m.mon.Detector().Egress(id, abuse.Egress{Time: ev.Time, Host: ev.Host, Port: int(ev.Port), Allowed: !denied, DNS: ev.Kind == "dns"})
		if denied {
			mt.m.opts.Metrics.EgressDenied(tenant, 1)
		}
		rec := node.EgressRecord{SessionID: id, Time: ev.Time, Kind: ev.Kind, Host: ev.Host, Addr: ev.Addr,
			Port: int(ev.Port), BytesUp: ev.BytesUp, BytesDown: ev.BytesDown, Decision: ev.Decision, Reason: ev.Reason}
		carriesBytes := ev.BytesUp+ev.BytesDown > 0
		if n := count.Add(1); n > MaxEgressRecords && !carriesBytes {
			if n == MaxEgressRecords+1 {
				rec = node.EgressRecord{SessionID: id, Time: ev.Time, Kind: ev.Kind, Decision: netpolicy.DecisionDeny,
					Reason: fmt.Sprintf("record limit of %d reached: later DNS queries and refusals are not recorded", MaxEgressRecords)}
			} else {
				return
			}
		}
		if carriesBytes {
			select {
			case mt.m.egressQueue <- rec:
			case <-time.After(2 * time.Second):
				mt.m.egressDropped.Add(1)
			}
			return
		}
		select {
		case mt.m.egressQueue <- rec:
		default:
			mt.m.egressDropped.Add(1)
		}
	}
}

// recordEgress writes queued egress records in batches until the manager
// closes (then it writes what is left).
func (mt *Meter) recordEgress() {
	defer mt.m.wg.Done()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var batch []node.EgressRecord
	flush := func() {
		if n := mt.m.egressDropped.Swap(0); n > 0 {
			mt.m.log.Warn("egress records dropped: the recorder fell behind", "records", n)
		}
		if len(batch) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := mt.m.opts.Store.AddEgress(ctx, batch); err != nil {
			mt.m.log.Error("write egress records", "records", len(batch), "err", err)
		}
		cancel()
		batch = batch[:0]
	}
	for {
		select {
		case r := <-mt.m.egressQueue:
			batch = append(batch, r)
			if len(batch) >= 256 {
				flush()
			}
		case <-tick.C:
			flush()
		case <-mt.m.closing:
			for {
				select {
				case r := <-mt.m.egressQueue:
					batch = append(batch, r)
				default:
					flush()
					return
				}
			}
		}
	}
}

// Egress returns session id's egress records, oldest first: up to limit
// (1-1000) after the first skip. ErrNotFound for an unknown session.
func (mt *Meter) Egress(ctx context.Context, id string, skip, limit int) ([]node.EgressRecord, error) {
	if limit < 1 || limit > 1000 {
		return nil, errdefs.InvalidField("limit", "must be between 1 and 1000")
	}
	if skip < 0 {
		return nil, errdefs.InvalidField("skip", "must not be negative")
	}
	if _, err := mt.m.Get(ctx, id); err != nil {
		return nil, err
	}
	return mt.m.opts.Store.ListEgress(ctx, id, skip, limit)
}

// egressBytes is what sb moved through its egress proxy: ended
// connections (recorded) plus those still open.
func (mt *Meter) egressBytes(ctx context.Context, sb *Sandbox) int64 {
	n, _ := mt.m.opts.Store.EgressBytes(ctx, sb.id)
	sb.mu.Lock()
	net := sb.net
	sb.mu.Unlock()
	if net != nil {
		n += net.OpenBytes()
	}
	return n
}

// memoryNetwork makes req, a session restored from memory snapshot snap,
// have a network exactly when snap's session had one: the checkpoint
// holds that session's network stack (gVisor's, in its Sentry) and gVisor
// restores only into a sandbox of the same shape. A request that names no
// network gets a copy of the source session's (its allow-list as it is
// now); one that names a network for a snapshot taken without one is
// ErrInvalidArgument naming network.
func (m *Manager) memoryNetwork(ctx context.Context, snap *node.Snapshot, req *node.CreateSpec) error {
	srcNet, err := m.snaps.SourceNetwork(ctx, snap)
	if err != nil {
		return fmt.Errorf("the session of memory snapshot %s: %w", snap.ID, err)
	}
	switch {
	case srcNet != nil && req.Network == nil:
		req.Network = copyNetwork(srcNet)
	case srcNet == nil && req.Network != nil:
		return errdefs.InvalidField("network", "memory snapshot %s was taken of a session without a network: sessions restored from it have none", snap.ID)
	}
	return nil
}
