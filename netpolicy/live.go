package netpolicy

import (
	"github.com/forkbox/forkbox/errdefs"
)

// policy is the policy in force: the allow-list that decides each new
// connection and DNS query.
func (e *Egress) policy() *Policy { return e.allow.Load() }

// SetAllow replaces e's allow-list with rules (empty: nothing is
// allowed) at once: every connection made and DNS query answered after it
// returns is decided by rules. Connections already open stay open; the
// byte and connection quotas run on as they were.
func (e *Egress) SetAllow(rules []Rule) {
	old := e.policy()
	e.allow.Store(&Policy{Allow: append([]Rule(nil), rules...), MaxBytes: old.MaxBytes, MaxConnsPerMinute: old.MaxConnsPerMinute})
}

// SetAllow replaces the allow-list of session id's running egress service
// (Egress.SetAllow). ErrNotFound when the session has no network on this
// service; ErrUnavailable while its egress service is not started yet
// (a daemon restart that waits for the ports of the previous one).
func (s *Service) SetAllow(id string, rules []Rule) error {
	s.mu.Lock()
	a := s.active[id]
	s.mu.Unlock()
	if a == nil {
		return errdefs.Newf(errdefs.ErrNotFound, "session %s has no network", id)
	}
	if a.egress == nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "the egress service of session %s is not running yet", id)
	}
	a.egress.SetAllow(rules)
	return nil
}
