package sandbox

import (
	"context"
	"errors"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
)

// SetNetwork replaces live session id's egress allow-list
// (node.Sessions.SetNetwork). The entries are checked as a create's are
// (netpolicy.ParseAllow, field "network.allow[i]") and against the
// tenant's egress ceiling (403 egress-not-allowed, audited); then the
// record is saved (forks, pause and a daemon restart keep it) and the
// running egress service takes the new list at once. A session made
// without a network has no namespace wired to an egress service, and one
// cannot be added to a running sandbox: ErrConflict.
func (mt *Meter) SetNetwork(ctx context.Context, id string, allow []string) (*node.Session, error) {
	m := mt.m
	sb := m.find(ctx, id)
	if sb == nil || !isLive(sb.Record().State) {
		_, _, err := m.use(ctx, id) // the right error for an ended or unknown session
		return nil, err
	}
	rules, err := netpolicy.ParseAllow("network.allow", allow)
	if err != nil {
		return nil, err
	}
	cur := sb.Record()
	if cur.Network == nil && len(allow) == 0 {
		return &cur, nil // nothing allowed, as before: no network is that
	}
	if cur.Network == nil {
		return nil, errdefs.Newf(errdefs.ErrConflict,
			"session %s was created without a network, and one cannot be added to a running sandbox: create it with a network allow-list", id)
	}
	if err := m.adm.CheckNetwork(ctx, cur.Tenant, allow); err != nil {
		return nil, err
	}
	sb.lifeMu.Lock()
	defer sb.lifeMu.Unlock()
	rec, err := m.save(ctx, sb, func(r *node.Session) error {
		if sb.tearing || !isLive(r.State) {
			return errdefs.Newf(errdefs.ErrConflict, "session %s is %s", id, node.StateTerminating)
		}
		n := copyNetwork(r.Network)
		n.Allow = append([]string{}, allow...)
		r.Network = n
		return nil
	})
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	att := sb.net
	sb.mu.Unlock()
	// No attachment yet: an adopted sandbox whose egress service waits
	// for the previous daemon's ports (retryNetwork), which reads the
	// saved record when it starts.
	if att != nil && m.opts.Net != nil {
		if err := m.opts.Net.SetAllow(id, rules); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
	m.log.Info("session network changed", "session", id, "tenant", rec.Tenant, "allow", len(allow))
	return &rec, nil
}
