package netpolicy

import (
	"fmt"
	"net"
	"net/netip"
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
	{"::/128", "unspecified"},
	{"::1/128", "loopback"},
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
// allows: alwaysBlocked, the host's own addresses, and mail ports.
type Blocklist struct {
	prefixes []netip.Prefix
	reasons  []string
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

// HostAddresses returns every address configured on the host's interfaces
// as single-address prefixes, for NewBlocklist.
func HostAddresses() (map[netip.Prefix]string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	out := map[netip.Prefix]string{}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		out[netip.PrefixFrom(ip, ip.BitLen())] = "the host's own address"
	}
	return out, nil
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
	return ""
}
