package netpolicy

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// alwaysBlocked are address ranges no allow-list can open: a sandbox must
// not reach the host, its network, other sandboxes or cloud metadata
// services, nor any address that is not globally reachable, whatever it
// was allowed. The list is every entry of IANA's IPv4 and IPv6
// Special-Purpose Address Registries (RFC 6890, updated by RFC 8190) whose
// "Globally Reachable" is False or N/A, plus multicast (RFC 5771, RFC
// 4291 2.7), the deprecated IPv4-compatible and site-local IPv6 ranges (RFC
// 4291 2.5.5.1, RFC 3879), and NAT64's well-known prefix (RFC 6052: global,
// but it reaches IPv4 ranges through IPv6). Where the registry marks a few
// addresses inside a refused block as global (the anycast services in
// 192.0.0.0/24 and 2001::/23, RFC 7723, RFC 8155, RFC 9665, and the
// AMT, AS112, ORCHIDv2 and DET prefixes in 2001::/23) the whole block is
// refused: a sandbox has no use for them. Beyond the list, an IPv6 address
// outside global unicast space (2000::/3, RFC 4291 2.4 and IANA's IPv6
// Address Space registry) is refused too, so that what IANA assigns from
// the reserved space later is refused from the start.
//
// doc marks the documentation ranges, which tests may open for their own
// hosts (WithTestNetworks).
var alwaysBlocked = []struct {
	prefix string
	why    string
	doc    bool
}{
	// IPv4 (IANA IPv4 Special-Purpose Address Registry).
	{prefix: "0.0.0.0/8", why: `"this network", RFC 791`},
	{prefix: "10.0.0.0/8", why: "private, RFC 1918"},
	{prefix: "100.64.0.0/10", why: "shared address space, RFC 6598"},
	{prefix: "127.0.0.0/8", why: "loopback, RFC 1122"},
	{prefix: "169.254.0.0/16", why: "link-local (cloud metadata), RFC 3927"},
	{prefix: "172.16.0.0/12", why: "private, RFC 1918"},
	{prefix: "192.0.0.0/24", why: "IETF protocol assignments, RFC 6890"},
	{prefix: "192.0.2.0/24", why: "documentation (TEST-NET-1), RFC 5737", doc: true},
	{prefix: "192.88.99.0/24", why: "deprecated 6to4 relay anycast, RFC 7526"},
	{prefix: "192.168.0.0/16", why: "private, RFC 1918"},
	{prefix: "198.18.0.0/15", why: "benchmarking, RFC 2544"},
	{prefix: "198.51.100.0/24", why: "documentation (TEST-NET-2), RFC 5737", doc: true},
	{prefix: "203.0.113.0/24", why: "documentation (TEST-NET-3), RFC 5737", doc: true},
	{prefix: "224.0.0.0/4", why: "multicast, RFC 5771"},
	{prefix: "240.0.0.0/4", why: "reserved and limited broadcast, RFC 1112, RFC 919"},
	// IPv6 (IANA IPv6 Special-Purpose Address Registry).
	{prefix: "::1/128", why: "loopback, RFC 4291"},
	{prefix: "::/96", why: "unspecified and IPv4-compatible, RFC 4291"},
	{prefix: "::ffff:0:0/96", why: "IPv4-mapped, RFC 4291"},
	{prefix: "::ffff:0:0:0/96", why: "IPv4-translated, RFC 2765"},
	{prefix: "64:ff9b::/96", why: "NAT64 (reaches IPv4 through IPv6), RFC 6052"},
	{prefix: "64:ff9b:1::/48", why: "local-use IPv4/IPv6 translation, RFC 8215"},
	{prefix: "100::/64", why: "discard-only, RFC 6666"},
	{prefix: "100:0:0:1::/64", why: "dummy IPv6 prefix, RFC 9780"},
	{prefix: "2001::/32", why: "Teredo (tunnels to IPv4), RFC 4380"},
	{prefix: "2001:2::/48", why: "benchmarking, RFC 5180"},
	{prefix: "2001::/23", why: "IETF protocol assignments, RFC 2928"},
	{prefix: "2001:db8::/32", why: "documentation, RFC 3849", doc: true},
	{prefix: "2002::/16", why: "6to4 (tunnels to IPv4), RFC 3056"},
	{prefix: "3fff::/20", why: "documentation, RFC 9637", doc: true},
	{prefix: "5f00::/16", why: "SRv6 segment identifiers, RFC 9602"},
	{prefix: "fc00::/7", why: "unique local (private), RFC 4193"},
	{prefix: "fe80::/10", why: "link-local, RFC 4291"},
	{prefix: "fec0::/10", why: "site-local (deprecated, private), RFC 3879"},
	{prefix: "ff00::/8", why: "multicast, RFC 4291"},
}

// globalUnicast6 is the IPv6 global unicast space (RFC 4291 2.4): IPv6
// addresses outside it are reserved by the IETF or special, never a
// host on the internet.
var globalUnicast6 = netip.MustParsePrefix("2000::/3")

// mailPorts are SMTP and submission ports, blocked for every destination:
// sandboxes do not send mail (spam is the classic abuse of free compute).
var mailPorts = map[uint16]bool{25: true, 465: true, 587: true, 2525: true}

// Blocklist decides which destinations are refused whatever a policy
// allows: alwaysBlocked, the extra ranges it was made with, mail ports and,
// after WithHostNetworks, the host's own addresses and the networks its
// interfaces are on (its LAN and gateway), read afresh every few seconds.
type Blocklist struct {
	prefixes []netip.Prefix
	reasons  []string
	doc      []bool         // prefixes[i] is a documentation range
	test     []netip.Prefix // documentation addresses tests opened
	host     *hostNetworks  // nil: not consulted
}

// hostNetworks caches the host's interface networks.
type hostNetworks struct {
	mu   sync.Mutex
	at   time.Time
	nets []netip.Prefix
}

// hostNetworksTTL is how long a reading of the host's networks is used.
const hostNetworksTTL = 2 * time.Second

func (h *hostNetworks) get() []netip.Prefix {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.at) < hostNetworksTTL {
		return h.nets
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return h.nets // keep the last reading
	}
	// A new slice each time: callers keep reading the previous one.
	nets := make([]netip.Prefix, 0, 2*len(addrs))
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ones, _ := ipn.Mask.Size()
		ip = ip.Unmap()
		nets = append(nets, netip.PrefixFrom(ip, ip.BitLen()), netip.PrefixFrom(ip, ones).Masked())
	}
	h.nets, h.at = nets, time.Now()
	return h.nets
}

// WithHostNetworks makes b also refuse the host's own addresses and the
// networks its interfaces are on, as they are at the time of each check
// (within a few seconds). It returns b.
func (b *Blocklist) WithHostNetworks() *Blocklist {
	b.host = &hostNetworks{}
	return b
}

// NewBlocklist returns the always-blocked ranges plus extra (the host's own
// addresses, the sandboxes' subnet) with the reason given for each.
func NewBlocklist(extra map[netip.Prefix]string) *Blocklist {
	b := &Blocklist{}
	for _, e := range alwaysBlocked {
		b.prefixes = append(b.prefixes, netip.MustParsePrefix(e.prefix))
		b.reasons = append(b.reasons, e.why)
		b.doc = append(b.doc, e.doc)
	}
	for p, why := range extra {
		b.prefixes = append(b.prefixes, p.Masked())
		b.reasons = append(b.reasons, why)
		b.doc = append(b.doc, false)
	}
	return b
}

// WithTestNetworks lets addresses in nets through the documentation
// ranges (RFC 5737, RFC 3849, RFC 9637), where tests put their own hosts
// (internal/testnet); every other refusal still applies to them. It
// returns b, or an error naming a prefix that is not inside a
// documentation range: nothing else can be opened.
func (b *Blocklist) WithTestNetworks(nets []netip.Prefix) (*Blocklist, error) {
	for _, n := range nets {
		n = n.Masked()
		inside := false
		for i, p := range b.prefixes {
			inside = inside || (b.doc[i] && p.Bits() <= n.Bits() && p.Contains(n.Addr()))
		}
		if !inside {
			return nil, fmt.Errorf("test network %s is not inside a documentation range", n)
		}
		b.test = append(b.test, n)
	}
	return b, nil
}

// isTest reports whether addr is in a network WithTestNetworks opened.
func (b *Blocklist) isTest(addr netip.Addr) bool {
	for _, n := range b.test {
		if n.Contains(addr) {
			return true
		}
	}
	return false
}

// Blocked returns why a connection to addr:port is refused whatever the
// policy says, or "" when it is not. IPv4-mapped IPv6 addresses are judged
// as the IPv4 address they carry.
func (b *Blocklist) Blocked(addr netip.Addr, port uint16) string {
	if mailPorts[port] {
		return fmt.Sprintf("port %d (mail) is always blocked", port)
	}
	if !addr.IsValid() {
		return "no address"
	}
	addr = addr.Unmap()
	test := b.isTest(addr)
	for i, p := range b.prefixes {
		if p.Contains(addr) && !(test && b.doc[i]) {
			return fmt.Sprintf("%s is in %s (%s), always blocked", addr, p, b.reasons[i])
		}
	}
	if addr.Is6() && !globalUnicast6.Contains(addr) {
		return fmt.Sprintf("%s is outside the IPv6 global unicast space %s (reserved, RFC 4291), always blocked", addr, globalUnicast6)
	}
	if b.host != nil {
		for _, p := range b.host.get() {
			if p.Contains(addr) {
				return fmt.Sprintf("%s is in %s (the host or a network it is on), always blocked", addr, p)
			}
		}
	}
	return ""
}
