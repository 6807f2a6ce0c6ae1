// Package broker is forkbox's credential broker: tenant secrets that never
// enter a sandbox. A session that asks for a secret gets a random
// placeholder in its environment; the egress proxy, for a connection to one
// of the secret's hosts, terminates TLS with a leaf from the session's own
// CA and swaps the placeholder for the value before it re-makes the
// connection upstream with full verification. This package holds what is
// independent of the isolation tier: validating a secret, sealing its value
// at rest, making placeholders and the per-session CA.
package broker

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"net/netip"
	"regexp"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/storage/seal"
)

// MaxValue is the largest secret value accepted, in bytes (64 KiB).
const MaxValue = 64 << 10

// nameRE is a secret name: a lower-case letter, then letters, digits or
// '_', at most 64 characters; upper-cased it is a valid environment
// variable name (POSIX.1-2017 8.1).
var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// hostRE is a DNS name (RFC 1123 labels), lower case, no trailing dot.
var hostRE = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Spec is a secret as a tenant sets it.
type Spec struct {
	// Name names the secret within its tenant; EnvName is the sandbox's
	// variable.
	Name string `json:"name"`
	// Hosts are the names (or IP literals) the value may be sent to, over
	// TLS on port 443 only.
	Hosts []string `json:"hosts"`
	// Header is an optional "Name: template" with one {value}: the header
	// the broker sets on each request to Hosts. Empty: the placeholder is
	// replaced wherever it appears in a request header.
	Header string `json:"header,omitempty"`
}

// EnvName returns the environment variable that carries the placeholder
// for the secret called name: the name upper-cased.
func EnvName(name string) string { return strings.ToUpper(name) }

// Validate checks s and value against the rules above and bl (an IP
// literal host in a range bl refuses is refused). It returns s with its
// hosts lower-cased and deduplicated, or an errdefs field error naming
// "name", "hosts", "header" or "value".
func Validate(s Spec, value []byte, bl *netpolicy.Blocklist) (Spec, error) {
	if !nameRE.MatchString(s.Name) {
		return Spec{}, errdefs.InvalidField("name", "%q: want a lower-case letter then up to 63 of a-z, 0-9, _", s.Name)
	}
	if len(s.Hosts) == 0 {
		return Spec{}, errdefs.InvalidField("hosts", "at least one host is required")
	}
	seen := map[string]bool{}
	var hosts []string
	for _, h := range s.Hosts {
		h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
		if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
			if why := bl.Blocked(a, 443); why != "" {
				return Spec{}, errdefs.InvalidField("hosts", "%s: %s", h, why)
			}
			h = a.String()
		} else if len(h) > 253 || !hostRE.MatchString(h) {
			return Spec{}, errdefs.InvalidField("hosts", "%q is not a host name", h)
		}
		if !seen[h] {
			seen[h] = true
			hosts = append(hosts, h)
		}
	}
	s.Hosts = hosts
	if s.Header != "" {
		name, tmpl, ok := strings.Cut(s.Header, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") {
			return Spec{}, errdefs.InvalidField("header", "want 'Name: template', got %q", s.Header)
		}
		if strings.Count(tmpl, "{value}") != 1 || strings.ContainsAny(tmpl, "\r\n") {
			return Spec{}, errdefs.InvalidField("header", "the template must hold {value} exactly once and no line break")
		}
	}
	if len(value) == 0 {
		return Spec{}, errdefs.InvalidField("value", "empty")
	}
	if len(value) > MaxValue {
		return Spec{}, errdefs.InvalidField("value", "%d bytes, at most %d", len(value), MaxValue)
	}
	if strings.ContainsAny(string(value), "\r\n\x00") {
		return Spec{}, errdefs.InvalidField("value", "must not hold CR, LF or NUL (it goes into an HTTP header)")
	}
	return s, nil
}

// sealer returns the AES-256-GCM AEAD for secret values: its key is
// HMAC-SHA256(master key, "forkbox secret values"), so values and
// snapshots never share a key.
func sealer(k *seal.Key) (cipher.AEAD, error) {
	m := hmac.New(sha256.New, k[:])
	m.Write([]byte("forkbox secret values"))
	b, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// Seal encrypts value for storage: a random 12-byte nonce followed by the
// AES-GCM ciphertext, with tenant and name as additional data so a sealed
// value cannot be moved to another secret or tenant.
func Seal(k *seal.Key, tenant, name string, value []byte) ([]byte, error) {
	a, err := sealer(k)
	if err != nil {
		return nil, err
	}
	n := make([]byte, a.NonceSize())
	if _, err := rand.Read(n); err != nil {
		return nil, err
	}
	return a.Seal(n, n, value, []byte(tenant+"\x00"+name)), nil
}

// Open decrypts what Seal returned for the same tenant and name. A changed,
// moved or truncated blob is an errdefs.ErrInternal error (the daemon cannot serve it).
func Open(k *seal.Key, tenant, name string, blob []byte) ([]byte, error) {
	a, err := sealer(k)
	if err != nil {
		return nil, err
	}
	if len(blob) < a.NonceSize()+a.Overhead() {
		return nil, errdefs.Newf(errdefs.ErrInternal, "secret %s: sealed value cut short", name)
	}
	v, err := a.Open(nil, blob[:a.NonceSize()], blob[a.NonceSize():], []byte(tenant+"\x00"+name))
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInternal, "secret %s: sealed value does not open (changed or moved)", name)
	}
	return v, nil
}
