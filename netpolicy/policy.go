// Package netpolicy is forkbox's egress control: a sandbox with a network
// policy gets its own network namespace whose only reachable destinations
// are its egress proxy and DNS server on the host (nftables, inside the
// sandbox's namespace and on the host), and those check every name and
// address against the policy's allow-list and the always-blocked ranges.
//
// Sandboxes without a policy keep forkbox's default: a network namespace
// with loopback only (runtime/runc), and nothing of this package runs.
package netpolicy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Policy is one sandbox's egress policy.
type Policy struct {
	// Allow is the allow-list; a destination not matched by a rule is
	// refused. It is never empty for a sandbox with a network.
	Allow []Rule
	// MaxBytes caps the bytes a sandbox moves through its proxy (sent plus
	// received, over all connections); past it every connection is closed
	// and new ones are refused. 0 means no cap.
	MaxBytes int64
	// MaxConnsPerMinute caps new connections (proxied connections and DNS
	// queries are not counted against each other: DNS has its own limit of
	// ten times this); past it new ones are refused. 0 means no cap.
	MaxConnsPerMinute int
}

// Rule is one allow-list entry, in one of three forms:
//
//	host:port          a DNS name, exactly (api.example.com:443)
//	*.domain:port      any name under domain, not domain itself
//	CIDR or CIDR:port  addresses (203.0.113.0/24, 198.51.100.7/32:8443);
//	                   without a port, every port
//
// Names are matched case-insensitively, without a trailing dot. A name rule
// always has a port.
type Rule struct {
	// Name is the lowercase DNS name, or the domain for a wildcard; empty
	// for an address rule.
	Name string
	// Wildcard marks a *.domain rule.
	Wildcard bool
	// Prefix is the address range of an address rule.
	Prefix netip.Prefix
	// Port is the allowed TCP port; 0 (address rules only) allows all.
	Port uint16
}

// String gives the rule in the form ParseRule reads.
func (r Rule) String() string {
	var s string
	switch {
	case r.Name == "":
		s = r.Prefix.String()
	case r.Wildcard:
		s = "*." + r.Name
	default:
		s = r.Name
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	return s
}

// ParseAllow parses allow-list entries (see Rule). Errors are
// errdefs.ErrInvalidArgument naming field[i], e.g. "network.allow[2]".
func ParseAllow(field string, entries []string) ([]Rule, error) {
	if len(entries) > MaxRules {
		return nil, errdefs.InvalidField(field, "at most %d entries", MaxRules)
	}
	out := make([]Rule, 0, len(entries))
	for i, e := range entries {
		r, err := ParseRule(e)
		if err != nil {
			return nil, errdefs.InvalidField(fmt.Sprintf("%s[%d]", field, i), "%v", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// MaxRules is the most entries one allow-list may have.
const MaxRules = 256

// ParseRule parses one allow-list entry (see Rule).
func ParseRule(s string) (Rule, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Rule{}, fmt.Errorf("empty entry")
	}
	if strings.Contains(s, "/") { // CIDR, optionally :port
		cidr, port := s, uint16(0)
		if i := strings.LastIndex(s, ":"); i > strings.LastIndex(s, "/") {
			p, err := parsePort(s[i+1:])
			if err != nil {
				return Rule{}, err
			}
			cidr, port = s[:i], p
		}
		pfx, err := netip.ParsePrefix(cidr)
		if err != nil {
			return Rule{}, fmt.Errorf("%q is not a CIDR (like 203.0.113.0/24 or 203.0.113.0/24:443)", s)
		}
		return Rule{Prefix: pfx.Masked(), Port: port}, nil
	}
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return Rule{}, fmt.Errorf("%q has no port: write host:port, *.domain:port or a CIDR", s)
	}
	port, err := parsePort(s[i+1:])
	if err != nil {
		return Rule{}, err
	}
	host := s[:i]
	if strings.Contains(host, ":") && !(strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]")) {
		return Rule{}, fmt.Errorf("%q is ambiguous: write an IPv6 address with a port as [address]:port", s)
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return Rule{Prefix: netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), Port: port}, nil
	}
	r := Rule{Port: port}
	if strings.HasPrefix(host, "*.") {
		r.Wildcard, host = true, host[2:]
	}
	name, ok := normalName(host)
	if !ok {
		return Rule{}, fmt.Errorf("%q is not a DNS name (letters, digits, '-' and '.'; use punycode for other scripts)", host)
	}
	if r.Wildcard && !strings.Contains(name, ".") {
		return Rule{}, fmt.Errorf("*.%s would allow a whole top-level domain", name)
	}
	r.Name = name
	return r, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || s[0] < '1' || s[0] > '9' {
		return 0, fmt.Errorf("port %q is not 1-65535", s)
	}
	return uint16(n), nil
}

// normalName lowercases a DNS name and drops one trailing dot; ok is false
// for anything that is not a syntactically valid ASCII host name.
func normalName(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if s == "" || len(s) > 253 {
		return "", false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return s, true
}

// AllowsName reports whether a connection to name (a DNS name, any case,
// trailing dot or not) on port is allowed by a name rule.
func (p *Policy) AllowsName(name string, port uint16) bool {
	n, ok := normalName(name)
	if !ok {
		return false
	}
	for _, r := range p.Allow {
		if r.Name != "" && r.Port == port && r.matchesName(n) {
			return true
		}
	}
	return false
}

// Resolvable reports whether name may be looked up at all: some name rule
// matches it, on any port. The DNS server answers only such names.
func (p *Policy) Resolvable(name string) bool {
	n, ok := normalName(name)
	if !ok {
		return false
	}
	for _, r := range p.Allow {
		if r.Name != "" && r.matchesName(n) {
			return true
		}
	}
	return false
}

// AllowsAddr reports whether a connection to addr on port is allowed by an
// address rule (a client that names an IP literal needs one).
func (p *Policy) AllowsAddr(addr netip.Addr, port uint16) bool {
	addr = addr.Unmap()
	for _, r := range p.Allow {
		if r.Name == "" && (r.Port == 0 || r.Port == port) && r.Prefix.Contains(addr) {
			return true
		}
	}
	return false
}

func (r Rule) matchesName(n string) bool {
	if r.Wildcard {
		return strings.HasSuffix(n, "."+r.Name)
	}
	return n == r.Name
}

// Covers reports whether every destination o allows is also allowed by r:
// a name rule covers the same name (a wildcard: any name under its domain,
// or a narrower wildcard) on the same port; an address rule covers an
// address rule inside its range on its port (or on any, when r has none).
// Tenants' egress ceilings are checked this way.
func (r Rule) Covers(o Rule) bool {
	if r.Name != "" {
		if o.Name == "" || o.Port != r.Port {
			return false
		}
		if !r.Wildcard {
			return !o.Wildcard && o.Name == r.Name
		}
		return strings.HasSuffix(o.Name, "."+r.Name) || (o.Wildcard && o.Name == r.Name)
	}
	if o.Name != "" || !o.Prefix.IsValid() || o.Prefix.Addr().Is4() != r.Prefix.Addr().Is4() {
		return false
	}
	return r.Prefix.Bits() <= o.Prefix.Bits() && r.Prefix.Contains(o.Prefix.Addr()) && (r.Port == 0 || r.Port == o.Port)
}
