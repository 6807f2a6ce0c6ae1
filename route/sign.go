package route

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/tenancy"
)

// InternalHeader carries a forwarded request's signed identity from the
// host that took it (the edge) to the host that serves it. Its value is
// URL-query encoded: v (format version, "1"), host (the sender's fleet
// id), to (the receiver's, so a header seen on its way to one host is
// refused by every other), ts (Unix seconds), nonce (hex), tenant, key,
// admin ("1" or "0") and sig, the hex HMAC-SHA256 of the canonical string (signedString)
// under the key derived from the fleet secret (DeriveKey).
const InternalHeader = "Forkbox-Internal"

// MaxSkew is how far a signed header's timestamp may be from the
// receiver's clock, either way; older or newer is refused.
const MaxSkew = 30 * time.Second

// keyLabel separates the routing key from every other use of the fleet
// secret (the NATS routes' password is the secret itself).
const keyLabel = "forkbox fleet request signing key v1"

// DeriveKey returns the request signing key of the fleet secret (the
// content of --fleet-secret-file): HMAC-SHA256 keyed with the secret over
// a fixed label, so the key is not the NATS route password.
func DeriveKey(secret string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(keyLabel))
	return m.Sum(nil)
}

// Identity is what a signed header carries: the caller the edge
// authenticated (Caller.Tenant, KeyID and Admin; zero for an envd or port
// request, which the owner checks by its own token) and the sender.
type Identity struct {
	// Host is the sending host's fleet id.
	Host string
	// Caller is the caller as the edge authenticated it (Authenticated
	// false: none, the owner checks the request's own credentials).
	Caller        tenancy.Caller
	Authenticated bool
}

// Signer signs outgoing requests and verifies incoming ones with one
// fleet key. Safe for concurrent use.
type Signer struct {
	key  []byte
	self string
	// Known reports whether a host id is in the fleet's host registry;
	// a header from any other sender is refused. Required.
	known func(id string) bool
	now   func() time.Time

	mu     sync.Mutex
	seen   map[string]time.Time // nonce → when it may be forgotten
	pruned time.Time
}

// NewSigner returns a Signer of host self with key (DeriveKey); known
// reports whether a sender is in the host registry.
func NewSigner(key []byte, self string, known func(id string) bool) *Signer {
	return &Signer{key: key, self: self, known: known, now: time.Now, seen: map[string]time.Time{}}
}

// signedString is the canonical string a signature covers: every field
// on its own line, so no field can run into the next.
func signedString(method, uri string, v url.Values) string {
	return strings.Join([]string{"forkbox-internal", v.Get("v"), method, uri, v.Get("host"), v.Get("to"), v.Get("ts"), v.Get("nonce"),
		v.Get("auth"), v.Get("tenant"), v.Get("key"), v.Get("admin")}, "\n")
}

func (s *Signer) mac(msg string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

// Sign sets r's InternalHeader (replacing any the client sent) for a
// request to host to (its fleet id) of method and URI (path and query,
// as r.URL.RequestURI gives it) carrying caller; authenticated false
// signs a request with no caller (envd, ports).
func (s *Signer) Sign(h http.Header, to, method, uri string, caller tenancy.Caller, authenticated bool) {
	nonce := make([]byte, 12)
	_, _ = rand.Read(nonce)
	v := url.Values{"v": {"1"}, "host": {s.self}, "to": {to}, "ts": {strconv.FormatInt(s.now().Unix(), 10)}, "nonce": {hex.EncodeToString(nonce)}}
	if authenticated {
		admin := "0"
		if caller.Admin {
			admin = "1"
		}
		v.Set("auth", "1")
		v.Set("tenant", caller.Tenant)
		v.Set("key", caller.KeyID)
		v.Set("admin", admin)
	}
	v.Set("sig", s.mac(signedString(method, uri, v)))
	h.Set(InternalHeader, v.Encode())
}

// Verify checks the InternalHeader value of a request of method and URI
// and returns the identity it carries. A malformed header, a bad
// signature, a header signed for another receiver, a timestamp more
// than MaxSkew away, a nonce already seen within that window (a replay)
// or a sender not in the registry is ErrUnauthenticated saying which.
func (s *Signer) Verify(value, method, uri string) (Identity, error) {
	v, err := url.ParseQuery(value)
	if err != nil || v.Get("v") != "1" || v.Get("sig") == "" || v.Get("nonce") == "" {
		return Identity{}, errdefs.Newf(errdefs.ErrUnauthenticated, "%s header: malformed", InternalHeader)
	}
	want := s.mac(signedString(method, uri, v))
	if !hmac.Equal([]byte(want), []byte(v.Get("sig"))) {
		return Identity{}, errdefs.Newf(errdefs.ErrUnauthenticated, "%s header: bad signature", InternalHeader)
	}
	if to := v.Get("to"); to != s.self {
		return Identity{}, errdefs.Newf(errdefs.ErrUnauthenticated, "%s header: signed for host %q, not this one", InternalHeader, to)
	}
	ts, err := strconv.ParseInt(v.Get("ts"), 10, 64)
	if err != nil {
		return Identity{}, errdefs.Newf(errdefs.ErrUnauthenticated, "%s header: bad timestamp", InternalHeader)
	}
	now := s.now()
	if d := now.Sub(time.Unix(ts, 0)); d > MaxSkew || d < -MaxSkew {
		return Identity{}, errdefs.Newf(errdefs.ErrUnauthenticated, "%s header: timestamp %v away from this host's clock (at most %v)",
			InternalHeader, d.Round(time.Second), MaxSkew)
	}
	host := v.Get("host")
	if host == s.self || !s.known(host) {
		return Identity{}, errdefs.Newf(errdefs.ErrUnauthenticated, "%s header: sender %q is no other host of the fleet's registry", InternalHeader, host)
	}
	if !s.fresh(host+"/"+v.Get("nonce"), now) {
		return Identity{}, errdefs.Newf(errdefs.ErrUnauthenticated, "%s header: replayed", InternalHeader)
	}
	id := Identity{Host: host}
	if v.Get("auth") == "1" {
		id.Authenticated = true
		id.Caller = tenancy.Caller{Tenant: v.Get("tenant"), KeyID: v.Get("key"), Admin: v.Get("admin") == "1"}
	}
	return id, nil
}

// fresh records nonce and reports whether it was not seen within the
// skew window; entries past twice the window are dropped every few seconds.
func (s *Signer) fresh(nonce string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.pruned) > MaxSkew/6 {
		s.pruned = now
		for n, until := range s.seen {
			if now.After(until) {
				delete(s.seen, n)
			}
		}
	}
	if until, ok := s.seen[nonce]; ok && now.Before(until) {
		return false
	}
	s.seen[nonce] = now.Add(2 * MaxSkew)
	return true
}
