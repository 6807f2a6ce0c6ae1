package daemon

import (
	"fmt"
	"log/slog"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/broker"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
)

// openSecrets returns the credential broker's secret service: values
// sealed under key (the daemon's snapshot key; the broker derives its own
// from it), IP-literal hosts judged by the egress service's blocklist
// (the default one without a service), upstreams verified against the
// system's roots plus those in the PEM file upstreamCA ("" for none).
func openSecrets(st *store.Store, key *seal.Key, netsvc *netpolicy.Service, rec *audit.Recorder, upstreamCA string,
	log *slog.Logger) (*broker.Secrets, error) {
	bl := netpolicy.NewBlocklist(nil).WithHostNetworks()
	if netsvc != nil {
		bl = netsvc.Blocklist()
	}
	s := broker.NewSecrets(st, key, bl, rec)
	s.SetLog(log)
	if upstreamCA != "" {
		if err := s.TrustUpstreamCAFile(upstreamCA); err != nil {
			return nil, fmt.Errorf("broker upstream CA: %w", err)
		}
	}
	return s, nil
}
