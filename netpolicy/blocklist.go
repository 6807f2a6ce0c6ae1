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
// services, whatever it was allowed. Sources: RFC 6890 special-purpose
// registries (IPv4 and IPv6), RFC 6598 (shared address space), RFC 6052
// (NAT64, which would reach IPv4 ranges through IPv6).
var alwaysBlocked = []struct {
	prefix string
	why    string
}{
	{"0.0.0.0/8", "this-network"},
	{"10.0.0.0/8", "private"},
	{"100.64.0.0/10", "shared address space"},
	{"127.0.0.0/8", "loopback"},
	{"169.254.0.0/16", "link-local (cloud metadata)"},
	{"172.16.0.0/12", "private"},
	{"192.0.0.0/24", "IETF protocol assignments"},
	{"192.168.0.0/16", "private"},
	{"198.18.0.0/15", "benchmarking"},
	{"224.0.0.0/4", "multicast"},
	{"240.0.0.0/4", "reserved"},
	{"::/96", "IPv4-compatible"},
	{"::1/128", "loopback"},
	{"::ffff:0:0:0/96", "IPv4-translated"},
	{"100::/64", "discard-only"},
	{"2001::/32", "Teredo (tunnels to IPv4)"},
	{"2002::/16", "6to4 (tunnels to IPv4)"},
	{"64:ff9b::/96", "NAT64"},
	{"64:ff9b:1::/48", "NAT64"},
	{"fc00::/7", "unique local (private)"},
	{"fe80::/10", "link-local"},
	{"ff00::/8", "multicast"},
}

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
	host     *hostNetworks // nil: not consulted
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
	}
	for p, why := range extra {
		b.prefixes = append(b.prefixes, p.Masked())
		b.reasons = append(b.reasons, why)
	}
	return b
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
	for i, p := range b.prefixes {
		if p.Contains(addr) {
			return fmt.Sprintf("%s is in %s (%s), always blocked", addr, p, b.reasons[i])
		}
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
