package broker

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
)

// Audit kinds the broker records (name and host, never a value).
const (
	KindSet     = "secret.set"
	KindRemove  = "secret.rm"
	KindUse     = "secret.use"
	KindRefused = "secret.refused"
)

// Secrets keeps tenants' secrets: validated, sealed under the daemon's key,
// audited. It holds no value in memory; Value opens one from the store at
// the moment of each request, so a removed secret stops at once.
type Secrets struct {
	st  *store.Store
	key *seal.Key
	bl  *netpolicy.Blocklist
	rec *audit.Recorder
	// roots verify the broker's upstream connections (nil: the system's).
	roots *x509.CertPool
	log   *slog.Logger
}

// NewSecrets returns the secret service over st, sealing with key, judging
// IP-literal hosts with bl and recording to rec (nil records nothing).
func NewSecrets(st *store.Store, key *seal.Key, bl *netpolicy.Blocklist, rec *audit.Recorder) *Secrets {
	return &Secrets{st: st, key: key, bl: bl, rec: rec, log: slog.Default()}
}

// SetLog makes the broker log to log (set before any session binds).
func (s *Secrets) SetLog(log *slog.Logger) { s.log = log }

// TrustUpstreamCAFile adds the PEM certificates in the file at path to the
// roots the broker verifies upstream servers with (the system's roots stay
// trusted): for private upstreams with their own CA. Call it before any
// session binds. An error when the file cannot be read or holds no
// certificate.
func (s *Secrets) TrustUpstreamCAFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(b) {
		return fmt.Errorf("%s holds no PEM certificate", path)
	}
	s.roots = pool
	return nil
}

// Set validates spec and value (field errors as Validate), seals the value
// and stores it for tenant, replacing a secret of that name. It returns the
// spec as stored and whether one was replaced.
func (s *Secrets) Set(ctx context.Context, tenant string, spec Spec, value []byte) (Spec, bool, error) {
	spec, err := Validate(spec, value, s.bl)
	if err != nil {
		return Spec{}, false, err
	}
	sealed, err := Seal(s.key, tenant, spec.Name, value)
	if err != nil {
		return Spec{}, false, err
	}
	replaced, err := s.st.PutSecret(ctx, store.Secret{Tenant: tenant, Name: spec.Name, Hosts: spec.Hosts, Header: spec.Header, Sealed: sealed})
	if err != nil {
		return Spec{}, false, err
	}
	s.rec.Record(ctx, audit.Event{Tenant: tenant, Kind: KindSet, Detail: map[string]any{"name": spec.Name, "hosts": spec.Hosts, "replaced": replaced}})
	return spec, replaced, nil
}

// List returns tenant's secrets (names, hosts, header templates; no values).
func (s *Secrets) List(ctx context.Context, tenant string) ([]Spec, error) {
	l, err := s.st.ListSecrets(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]Spec, 0, len(l))
	for _, sec := range l {
		out = append(out, Spec{Name: sec.Name, Hosts: sec.Hosts, Header: sec.Header})
	}
	return out, nil
}

// Get returns tenant's secret name without its value; ErrNotFound naming it
// when the tenant has none of that name.
func (s *Secrets) Get(ctx context.Context, tenant, name string) (Spec, error) {
	sec, err := s.st.GetSecret(ctx, tenant, name)
	if err != nil {
		return Spec{}, err
	}
	return Spec{Name: sec.Name, Hosts: sec.Hosts, Header: sec.Header}, nil
}

// Remove deletes tenant's secret name; every placeholder for it is
// worthless from then on. ErrNotFound naming it when there is none.
func (s *Secrets) Remove(ctx context.Context, tenant, name string) error {
	if err := s.st.DeleteSecret(ctx, tenant, name); err != nil {
		return err
	}
	s.rec.Record(ctx, audit.Event{Tenant: tenant, Kind: KindRemove, Detail: map[string]any{"name": name}})
	return nil
}

// Value returns the clear value of tenant's secret name for a request to
// host (lower-case, no port), opened from the store now; ok false when the
// secret no longer exists or no longer lists host (it was replaced with
// other hosts since a session was bound: its new value goes only to its
// new hosts). An error is a store or sealing failure (the caller refuses
// the request).
func (s *Secrets) Value(ctx context.Context, tenant, name, host string) (value []byte, ok bool, err error) {
	sec, err := s.st.GetSecret(ctx, tenant, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if !slices.Contains(sec.Hosts, host) {
		return nil, false, nil
	}
	v, err := Open(s.key, tenant, name, sec.Sealed)
	return v, err == nil, err
}
