package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/forkbox/forkbox/broker"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// MaxSessionSecrets bounds the secrets one session may ask for.
const MaxSessionSecrets = 32

// TrustBundle is where a session with secrets finds its trust store: the
// template's bundle with the session's broker CA appended, mounted
// read-only over the template's; SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
// CURL_CA_BUNDLE and NODE_EXTRA_CA_CERTS name it.
const TrustBundle = "/etc/ssl/certs/ca-certificates.crt"

// maxTemplateBundle bounds the template's trust bundle read into a
// session's (bytes).
const maxTemplateBundle = 8 << 20

// normalizeSecrets moves a create's secrets into its network (a copy:
// forks share the spec's) and checks them: a session with secrets needs a
// network. ErrInvalidArgument naming "secrets".
func normalizeSecrets(r *node.CreateSpec) error {
	if len(r.Secrets) > 0 {
		if r.Network == nil {
			return errdefs.InvalidField("secrets", "a session with secrets needs a network whose allow-list has their hosts on port 443")
		}
		r.Network = copyNetwork(r.Network)
		r.Network.Secrets = append([]string(nil), r.Secrets...)
		r.Secrets = nil
	}
	if r.Network == nil || len(r.Network.Secrets) == 0 {
		return nil
	}
	var names []string
	for _, n := range r.Network.Secrets {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if len(names) > MaxSessionSecrets {
		return errdefs.InvalidField("secrets", "at most %d secrets", MaxSessionSecrets)
	}
	r.Network = copyNetwork(r.Network)
	r.Network.Secrets = names
	return nil
}

// checkSecrets refuses a create whose secrets tenant has not (another
// tenant's are not found either) or whose network's allow-list does not
// allow every host of its secrets on port 443 (the allow-list decides
// where a sandbox connects; secrets add nothing to it).
// ErrInvalidArgument naming "secrets[i]"; ErrUnavailable without a broker.
func (m *Manager) checkSecrets(ctx context.Context, tenant string, n *node.Network) error {
	if n == nil || len(n.Secrets) == 0 {
		return nil
	}
	if m.opts.Secrets == nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "this daemon has no credential broker")
	}
	p, err := policyOf(n)
	if err != nil {
		return err
	}
	for i, name := range n.Secrets {
		field := fmt.Sprintf("secrets[%d]", i)
		spec, err := m.opts.Secrets.Get(ctx, tenant, name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.InvalidField(field, "secret %q does not exist", name)
		}
		if err != nil {
			return err
		}
		for _, h := range spec.Hosts {
			allowed := false
			if a, err := netip.ParseAddr(h); err == nil {
				allowed = p.AllowsAddr(a, 443)
			} else {
				allowed = p.AllowsName(h, 443)
			}
			if !allowed {
				return errdefs.InvalidField(field, "secret %q has host %s, which network.allow does not allow on port 443 (add %s:443)", name, h, h)
			}
		}
	}
	return nil
}

// bindSecrets makes sb's broker (new placeholders, a new CA) once its
// network is attached, gives it to the egress service, and returns the
// environment and the trust-store mount the sandbox needs (nothing when
// it has no secrets). rootfs is its root filesystem, whose trust bundle is
// read (inside it: nothing outside rootfs is followed) to be extended.
func (m *Manager) bindSecrets(ctx context.Context, sb *Sandbox, rootfs string) (map[string]string, []runtime.Mount, error) {
	rec := sb.Record()
	if rec.Network == nil || len(rec.Network.Secrets) == 0 {
		return nil, nil, nil
	}
	if m.opts.Secrets == nil {
		return nil, nil, errdefs.Newf(errdefs.ErrUnavailable, "this daemon has no credential broker")
	}
	bs, err := m.opts.Secrets.Bind(ctx, rec.Tenant, sb.id, rec.Network.Secrets)
	if err != nil {
		return nil, nil, err
	}
	sealed, err := bs.Sealed()
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(sb.dir, brokerStateFile), sealed, 0o600); err != nil {
		return nil, nil, err
	}
	if err := m.opts.Net.Intercept(sb.id, bs); err != nil {
		return nil, nil, err
	}
	bundle := append(templateBundle(rootfs), '\n')
	bundle = append(bundle, bs.CA().PEM()...)
	path := filepath.Join(sb.dir, "broker-ca.crt")
	if err := os.WriteFile(path, bundle, 0o644); err != nil {
		return nil, nil, err
	}
	env := map[string]string{}
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"} {
		env[k] = TrustBundle
	}
	for _, b := range bs.Bindings() {
		env[broker.EnvName(b.Name)] = b.Placeholder
	}
	return env, []runtime.Mount{{Source: path, Target: TrustBundle, ReadOnly: true}}, nil
}

// brokerStateFile, in a sandbox's state directory (root only), holds its
// broker's state sealed (broker.Session.Sealed: the CA key and the
// placeholders, no value), for a restarted daemon to restore.
const brokerStateFile = "broker.sealed"

// restoreSecrets gives adopted sandbox sb's running egress service its
// broker again from the sealed state bindSecrets left (a daemon restart).
// When that fails the session's secret hosts are passed through like any
// other: its placeholders reach them unreplaced, worthless, and the value
// is never sent.
func (m *Manager) restoreSecrets(sb *Sandbox) {
	rec := sb.Record()
	if rec.Network == nil || len(rec.Network.Secrets) == 0 {
		return
	}
	err := func() error {
		if m.opts.Secrets == nil {
			return errors.New("this daemon has no credential broker")
		}
		blob, err := os.ReadFile(filepath.Join(sb.dir, brokerStateFile))
		if err != nil {
			return err
		}
		bs, err := m.opts.Secrets.Restore(rec.Tenant, sb.id, blob)
		if err != nil {
			return err
		}
		return m.opts.Net.Intercept(sb.id, bs)
	}()
	if err != nil {
		m.log.Warn("adopt: the session's secrets do not work after this restart (its secret hosts are passed through, placeholders unreplaced)",
			"session", sb.id, "err", err)
	}
}

// templateBundle returns the trust bundle in rootfs (nil when it has
// none, or a special file there), read through an os.Root so that a
// symlink in a snapshot's files cannot make the daemon read outside the
// sandbox's root.
func templateBundle(rootfs string) []byte {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil
	}
	defer root.Close()
	// O_NONBLOCK: a FIFO planted there opens at once (and is refused
	// below) instead of blocking the create until a writer comes.
	f, err := root.OpenFile(TrustBundle[1:], os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, maxTemplateBundle))
	return b
}
