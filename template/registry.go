package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage/layercache"
)

// Problem types of pull errors more precise than their class (the API
// edge maps them to statuses: api/problem.go).
const (
	// ProblemRegistryUnreachable: the registry did not answer (connection
	// refused, a name that does not resolve, a timeout): 504.
	ProblemRegistryUnreachable = "registry-unreachable"
	// ProblemRegistryError: the registry answered with a server error or
	// served content that does not match its digest: 502.
	ProblemRegistryError = "registry-error"
	// ProblemRegistryDenied: the registry refused the credentials given
	// (or asked for some when none were): 403.
	ProblemRegistryDenied = "registry-denied"
	// ProblemRegistryAddress: the registry is at an address the caller's
	// pulls may not reach (a tenant's pull of a private address): 403.
	ProblemRegistryAddress = "registry-address-not-allowed"
	// ProblemTemplateTooLarge: the image is larger than the tenant's
	// max_template_mb or the host's limit: 413.
	ProblemTemplateTooLarge = "template-too-large"
)

// RegistryPolicy says which registries the daemon's pulls may reach.
type RegistryPolicy struct {
	// PrivateRegistries are registries (host or host:port, as references
	// name them) that any caller's pulls may reach although they resolve
	// to a private, loopback or link-local address; other such addresses
	// are reachable by callers with PullOptions.AnyAddress only (admins:
	// the host's owner).
	PrivateRegistries []string
	// ResponseTimeout bounds the wait for a registry's answer to each
	// request (its headers), and for a TCP or TLS handshake; 0: 30s.
	ResponseTimeout time.Duration
}

// pullTransport is the HTTP transport of one pull: TLS by default, plain
// HTTP only to the registries o names insecure and to loopback names, and
// connections only to public addresses unless o.AnyAddress or the
// registry is one of p's private ones. Its dial checks the address it
// connects to (after the name is resolved), so a name that resolves to a
// private address, a token realm or a redirect elsewhere gets no further.
func pullTransport(p RegistryPolicy, o PullOptions) http.RoundTripper {
	timeout := p.ResponseTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	d := &addressDialer{
		private: slices.Clone(p.PrivateRegistries),
		any:     o.AnyAddress,
		dialer:  net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second},
	}
	t := &http.Transport{
		// No proxy from the environment: the address checks are of the
		// registry's own address.
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       30 * time.Second,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
	}
	return &schemeGuard{next: t, insecure: o.InsecureRegistries}
}

// schemeGuard refuses plain HTTP requests to any host but the insecure
// registries named and loopback names (localhost, 127.0.0.0/8, ::1).
// go-containerregistry falls back to HTTP for some hosts by itself (those
// at private addresses): this keeps that to what the caller asked for.
type schemeGuard struct {
	next     http.RoundTripper
	insecure []string
}

// plainHTTPError is a plain HTTP request schemeGuard refused.
type plainHTTPError struct{ host string }

// Error names the host and what allows it.
func (e *plainHTTPError) Error() string {
	return fmt.Sprintf("plain HTTP to %s refused: name the registry insecure (insecure_registries, --insecure-registry) to allow it", e.host)
}

// maxManifestBytes bounds a manifest or index a registry serves, in
// bytes: 4 MiB, the limit distribution (the reference registry) puts on
// the manifests it accepts. go-containerregistry's own bound is 100 MiB
// per manifest, read into memory and parsed, which a hostile registry
// could make a few concurrent pulls hold many times over.
const maxManifestBytes = 4 << 20

// manifestTooLargeError is a registry's manifest over maxManifestBytes.
type manifestTooLargeError struct{ url string }

// Error names the manifest and the limit.
func (e *manifestTooLargeError) Error() string {
	return fmt.Sprintf("the manifest at %s is larger than %d bytes", e.url, maxManifestBytes)
}

// cappedBody is a manifest response's body that fails past maxManifestBytes.
type cappedBody struct {
	io.ReadCloser
	url  string
	left int64
}

// Read reads at most what is left of the bound, and fails once the body
// goes past it.
func (b *cappedBody) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return 0, &manifestTooLargeError{url: b.url}
	}
	return n, err
}

// RoundTrip refuses a plain HTTP request that is not allowed, passes on
// the rest, and bounds the manifests answered (maxManifestBytes).
func (g *schemeGuard) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme == "http" && !plainAllowed(r.URL.Host, g.insecure) {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, &plainHTTPError{host: r.URL.Host}
	}
	resp, err := g.next.RoundTrip(r)
	if err != nil || !strings.Contains(r.URL.Path, "/manifests/") {
		return resp, err
	}
	u := r.URL.Redacted()
	if resp.ContentLength > maxManifestBytes {
		resp.Body.Close()
		return nil, &manifestTooLargeError{url: u}
	}
	resp.Body = &cappedBody{ReadCloser: resp.Body, url: u, left: maxManifestBytes}
	return resp, nil
}

// CloseIdleConnections closes the transport's idle connections.
func (g *schemeGuard) CloseIdleConnections() {
	if t, ok := g.next.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}

// plainAllowed reports whether host (host[:port]) may be spoken to in
// plain HTTP: it is named in insecure (with or without the port), or it
// is a loopback name.
func plainAllowed(host string, insecure []string) bool {
	if registryListed(host, insecure) {
		return true
	}
	h := hostOnly(host)
	if h == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.IsLoopback()
}

// registryListed reports whether host (host[:port]) is in list, whose
// entries name a host (any port) or a host:port.
func registryListed(host string, list []string) bool {
	h := hostOnly(host)
	for _, e := range list {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == strings.ToLower(host) || e == strings.ToLower(h) {
			return true
		}
	}
	return false
}

// hostOnly is host without its port (and without IPv6 brackets).
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return strings.ToLower(h)
	}
	return strings.ToLower(strings.Trim(host, "[]"))
}

// addressDialer dials only public addresses unless any, or the host
// dialed is one of private.
type addressDialer struct {
	private []string
	any     bool
	dialer  net.Dialer
}

// addressError is a connection refused because of where it would go.
type addressError struct {
	host string
	addr netip.Addr
}

// Error names the host and the address.
func (e *addressError) Error() string {
	where := fmt.Sprintf("%s is at %s,", e.host, e.addr)
	if e.host == e.addr.String() {
		where = e.host + " is"
	}
	return where + " a private, loopback or link-local address, which this caller's pulls may not reach " +
		"(the daemon's --private-registry allows a registry there; an admin key's pulls reach any address)"
}

// DialContext dials address (host:port), checking the address it
// connects to.
func (d *addressDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if d.any || registryListed(address, d.private) {
		return d.dialer.DialContext(ctx, network, address)
	}
	dl := d.dialer
	dl.Control = func(_, resolved string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(resolved)
		if err != nil {
			return err
		}
		if !publicAddr(ap.Addr()) {
			return &addressError{host: hostOnly(address), addr: ap.Addr()}
		}
		return nil
	}
	return dl.DialContext(ctx, network, address)
}

// nonPublic are ranges that are not the internet's beside what
// netip.Addr's methods name: shared address space (RFC 6598), this
// network (RFC 791), IETF protocol assignments, benchmarking (RFC 2544),
// the documentation ranges, NAT64 and 6to4 relays and discard-only.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2002::/16"),
}

// publicAddr reports whether a is an internet unicast address: not
// loopback, private (RFC 1918, unique local), link-local, multicast,
// unspecified nor in nonPublic. An IPv4-mapped IPv6 address is judged as
// the IPv4 address.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsGlobalUnicast() || a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// registryError classes err, an error of pulling ref (the reference as
// the caller gave it) from a registry, once, for the API edge: the
// registry's refusals and failures, unreachable registries, content that
// does not match its digest, and our own refusals (plain HTTP, private
// addresses). Every message names ref. Errors already classed (ours:
// errdefs) and ctx's are returned as they are.
func registryError(ref string, err error) error {
	var (
		te   *transport.Error
		mm   *layercache.MismatchError
		ph   *plainHTTPError
		mt   *manifestTooLargeError
		ae   *addressError
		dnse *net.DNSError
		ne   net.Error
		tye  *errdefs.TypedError
		fe   *errdefs.FieldError
	)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &tye), errors.As(err, &fe):
		return err
	case errors.As(err, &ae):
		return errdefs.Typed(errdefs.ErrPermissionDenied, ProblemRegistryAddress, "pull %s: %s", ref, ae.Error())
	case errors.As(err, &ph):
		return errdefs.InvalidField("insecure_registries", "pull %s: %s", ref, ph.Error())
	case errors.As(err, &mt):
		return errdefs.Typed(errdefs.ErrUnavailable, ProblemRegistryError, "pull %s: %s", ref, mt.Error())
	case errors.As(err, &mm):
		return errdefs.Typed(errdefs.ErrUnavailable, ProblemRegistryError,
			"pull %s: the registry served content that does not match its digest (%s); nothing of it was kept", ref, mm.Error())
	case errors.As(err, &te):
		return transportError(ref, te)
	case errors.As(err, &dnse):
		return errdefs.Typed(errdefs.ErrUnavailable, ProblemRegistryUnreachable, "pull %s: the registry's name does not resolve (%s)", ref, dnse.Name)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return errdefs.Typed(errdefs.ErrUnavailable, ProblemRegistryUnreachable, "pull %s: the registry does not answer (%s)", ref, shortErr(err))
	case errors.As(err, &ne), errors.Is(err, syscall.ECONNRESET), strings.Contains(err.Error(), "EOF"):
		return errdefs.Typed(errdefs.ErrUnavailable, ProblemRegistryError, "pull %s: the connection to the registry failed (%s)", ref, shortErr(err))
	}
	return fmt.Errorf("pull %s: %w", ref, err)
}

// transportError classes an error answer of a registry.
func transportError(ref string, te *transport.Error) error {
	codes := map[transport.ErrorCode]bool{}
	for _, d := range te.Errors {
		codes[d.Code] = true
	}
	what := shortErr(te)
	switch {
	case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
		codes[transport.UnauthorizedErrorCode] || codes[transport.DeniedErrorCode]:
		return errdefs.Typed(errdefs.ErrPermissionDenied, ProblemRegistryDenied,
			"pull %s: the registry refused access (%s); give credentials that may read it (--username and --password-stdin, "+
				"a docker config, or the request's auth)", ref, what)
	case te.StatusCode == http.StatusNotFound || codes[transport.ManifestUnknownErrorCode] ||
		codes[transport.NameUnknownErrorCode] || codes[transport.BlobUnknownErrorCode]:
		return errdefs.Newf(errdefs.ErrNotFound, "image %s in its registry (%s)", ref, what)
	case te.StatusCode == http.StatusTooManyRequests || codes[transport.TooManyRequestsErrorCode]:
		return errdefs.Typed(errdefs.ErrUnavailable, ProblemRegistryError, "pull %s: the registry limits its rate (%s); retry later", ref, what)
	case te.StatusCode >= 500:
		return errdefs.Typed(errdefs.ErrUnavailable, ProblemRegistryError, "pull %s: the registry failed (%s)", ref, what)
	}
	return errdefs.Typed(errdefs.ErrUnavailable, ProblemRegistryError, "pull %s: the registry refused the request (%s)", ref, what)
}

// shortErr is err's message cut to 300 bytes (a registry's error body
// can be a whole HTML page).
func shortErr(err error) string {
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
