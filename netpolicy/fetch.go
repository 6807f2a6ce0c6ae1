package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// fetchRedirects is how many redirects a Fetch follows (each to a
// destination checked again).
const fetchRedirects = 10

// Fetcher downloads files for the daemon itself under an allow-list (a
// Dockerfile's ADD of a URL): every connection it makes, redirects
// included, is checked as a sandbox's would be (Egress.dial: the
// allow-list by the name asked for, the name resolved by the daemon's
// resolver, every address checked against the blocklist), so a build's
// download reaches exactly what its RUN steps could. It never uses the
// host's proxy settings. Safe for concurrent use.
type Fetcher struct {
	block    *Blocklist
	resolver Resolver
	sink     Sink
}

// Fetcher returns a Fetcher with the service's blocklist and resolver;
// its connections are recorded as events of kind "fetch" in sink (nil:
// dropped).
func (s *Service) Fetcher(sink Sink) *Fetcher {
	return &Fetcher{block: s.block, resolver: s.opts.Resolver, sink: sink}
}

// NewFetcher returns a Fetcher with blocklist b and resolver r (a test's,
// or a daemon's without a Service); nil r is the host's resolver.
func NewFetcher(b *Blocklist, r Resolver) *Fetcher {
	if r == nil {
		r = net.DefaultResolver
	}
	return &Fetcher{block: b, resolver: r}
}

// Fetch GETs rawURL (http or https) with allow as the allow-list and
// writes the body to w, at most maxBytes of it (> 0). It returns the
// bytes written. Errors: ErrInvalidArgument (field "allow") when allow
// is empty or refuses a destination (the detail names the host and
// port), or a destination is always blocked; ErrInvalidArgument (field
// "url") for a URL that is not http(s) or a status other than 200;
// ErrResourceExhausted when the body is longer than maxBytes; the
// network's error otherwise.
func (f *Fetcher) Fetch(ctx context.Context, rawURL string, allow []string, maxBytes int64, w io.Writer) (int64, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return 0, errdefs.InvalidField("url", "%q is not an http or https URL", rawURL)
	}
	if len(allow) == 0 {
		return 0, errdefs.InvalidField("allow", "%s is not allowed: the build has no egress allow-list (no network)", u.Host)
	}
	rules, err := ParseAllow("allow", allow)
	if err != nil {
		return 0, err
	}
	e := New(Config{SessionID: "fetch", Policy: &Policy{Allow: rules}, Blocklist: f.block, Resolver: f.resolver, Sink: f.sink})
	defer e.Close()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := splitHostPort(addr, 80)
			if err != nil {
				return nil, err
			}
			return e.dial(ctx, "fetch", host, port)
		},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		DisableKeepAlives:     true,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= fetchRedirects {
			return fmt.Errorf("more than %d redirects", fetchRedirects)
		}
		if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
			return fmt.Errorf("a redirect to %q", req.URL.Redacted())
		}
		return nil
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, errdefs.InvalidField("url", "%v", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		var d *denied
		if errors.As(err, &d) {
			return 0, errdefs.InvalidField("allow", "%s", d.reason)
		}
		return 0, fmt.Errorf("GET %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, errdefs.InvalidField("url", "GET %s: %s", u.Redacted(), resp.Status)
	}
	if resp.ContentLength > maxBytes {
		return 0, errdefs.Newf(errdefs.ErrResourceExhausted, "GET %s: %d bytes, more than the %d allowed", u.Redacted(), resp.ContentLength, maxBytes)
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return n, fmt.Errorf("GET %s: %w", u.Redacted(), err)
	}
	if n > maxBytes {
		return n, errdefs.Newf(errdefs.ErrResourceExhausted, "GET %s: more than the %d bytes allowed", u.Redacted(), maxBytes)
	}
	return n, nil
}
