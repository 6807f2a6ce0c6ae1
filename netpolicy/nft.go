package netpolicy

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The ports the egress service listens on, on a sandbox's gateway
// address. The sandbox uses the well-known ports (HTTP_PROXY on 3128, DNS
// on 53, any address on 80 and 443); nftables in its namespace redirects
// them here, so the host may run its own services on those ports.
const (
	ProxyPort       = 3128 // what the sandbox's HTTP_PROXY names
	listenProxyPort = 15128
	listenHTTPPort  = 15080
	listenTLSPort   = 15443
	listenDNSPort   = 15053
	// refusedPort is where the host table sends the TCP connections of a
	// sandbox that nothing serves: the input chain resets them.
	refusedPort = 15009
	// LegacyHostTable is the one host table every daemon shared before
	// each had its own (ServiceOptions.Table).
	LegacyHostTable      = "forkbox"
	sandboxTableName     = "forkbox_sandbox"
	hostInterfacePrefix  = "fbx"
	sandboxInterfaceName = "eth0"
)

// rule is a sequence of nftables expressions, built with the helpers below.
type rule []expr.Any

func (r rule) then(e ...expr.Any) rule { return append(append(rule{}, r...), e...) }

// match compares register 1, after load, with data.
func match(load expr.Any, data []byte) rule {
	return rule{load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}}
}

func ipv4() rule {
	return match(&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, []byte{unix.NFPROTO_IPV4})
}

func l4(proto byte) rule {
	return match(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, []byte{proto})
}

func daddr4(a netip.Addr) rule {
	b := a.As4()
	return match(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}, b[:])
}

// inSubnet4 matches an IPv4 destination inside p.
func inSubnet4(p netip.Prefix) rule {
	mask := net.CIDRMask(p.Bits(), 32)
	a := p.Masked().Addr().As4()
	return rule{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

func dport(p uint16) rule {
	return match(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		binaryutil.BigEndian.PutUint16(p))
}

// ifname matches an interface name exactly, or a prefix when prefix is set.
func ifname(key expr.MetaKey, name string, prefix bool) rule {
	data := []byte(name)
	if !prefix {
		data = append(data, 0)
	}
	return match(&expr.Meta{Key: key, Register: 1}, data)
}

func established() rule {
	return rule{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func accept() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }
func drop() expr.Any   { return &expr.Verdict{Kind: expr.VerdictDrop} }

// dnat rewrites the destination to a:port.
func dnat(a netip.Addr, port uint16) rule {
	b := a.As4()
	return rule{
		&expr.Immediate{Register: 1, Data: b[:]},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// redirect rewrites the destination to port on the address of the
// interface the packet came in on (a sandbox link's gateway).
func redirect(port uint16) rule {
	return rule{
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 2, Flags: expr.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

// toOwnGateway matches a packet addressed to an address of the interface
// it came in on (a sandbox link: its own gateway), not to another link's.
func toOwnGateway() rule {
	return match(&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL))
}

// notToOwnGateway is toOwnGateway negated.
func notToOwnGateway() rule {
	return rule{&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)}}
}

// spoofed matches a packet whose source address has no route back through
// the interface it came in on (reverse-path filter).
func spoofed() rule {
	return match(&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
		binaryutil.NativeEndian.PutUint32(0))
}

// refuse rejects a packet at once: a TCP reset, else ICMP administratively
// prohibited, so that what a sandbox may not reach fails fast instead of
// timing out.
func refuse() rule {
	return rule{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
}

// sandboxRules installs the sandbox namespace's table (netnsFD is a handle
// on that namespace): outbound, only the egress service on gw is
// reachable (well-known ports redirected to it), everything else is
// refused at once (TCP reset, or ICMP administratively prohibited);
// inbound, only replies. Root in the sandbox cannot change these: the
// namespace belongs to the host's user namespace, where the sandbox has no
// capabilities.
func sandboxRules(netnsFD int, gw netip.Addr) error {
	c, err := nftables.New(nftables.WithNetNSFd(netnsFD))
	if err != nil {
		return fmt.Errorf("nftables in the sandbox namespace: %w", err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: sandboxTableName})
	add := func(ch *nftables.Chain, r rule) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r}) }

	nat := c.AddChain(&nftables.Chain{Name: "redirect", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	tcp, udp := l4(unix.IPPROTO_TCP), l4(unix.IPPROTO_UDP)
	add(nat, ipv4().then(daddr4(gw)...).then(tcp...).then(dport(ProxyPort)...).then(dnat(gw, listenProxyPort)...))
	add(nat, ipv4().then(daddr4(gw)...).then(tcp...).then(dport(53)...).then(dnat(gw, listenDNSPort)...))
	add(nat, ipv4().then(daddr4(gw)...).then(udp...).then(dport(53)...).then(dnat(gw, listenDNSPort)...))
	add(nat, ipv4().then(tcp...).then(dport(80)...).then(dnat(gw, listenHTTPPort)...))
	add(nat, ipv4().then(tcp...).then(dport(443)...).then(dnat(gw, listenTLSPort)...))

	policyDrop := nftables.ChainPolicyDrop
	out := c.AddChain(&nftables.Chain{Name: "out", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &policyDrop})
	add(out, ifname(expr.MetaKeyOIFNAME, "lo", false).then(accept()))
	for _, p := range []uint16{listenProxyPort, listenHTTPPort, listenTLSPort, listenDNSPort} {
		add(out, ipv4().then(daddr4(gw)...).then(tcp...).then(dport(p)...).then(accept()))
	}
	add(out, ipv4().then(daddr4(gw)...).then(udp...).then(dport(listenDNSPort)...).then(accept()))
	add(out, tcp.then(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))
	add(out, rule{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})

	in := c.AddChain(&nftables.Chain{Name: "in", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policyDrop})
	add(in, ifname(expr.MetaKeyIIFNAME, "lo", false).then(accept()))
	add(in, established().then(accept()))

	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables rules in the sandbox namespace: %w", err)
	}
	return nil
}

// sandboxLinks matches packets whose interface (key: the input or output
// interface's group) is a sandbox host link of group: named fbx*, in
// group (a daemon's links), or any fbx* link when group is 0 (tables of
// before link groups).
func sandboxLinks(nameKey, groupKey expr.MetaKey, group uint32) rule {
	r := ifname(nameKey, hostInterfacePrefix, true)
	if group != 0 {
		r = r.then(match(&expr.Meta{Key: groupKey, Register: 1}, binaryutil.NativeEndian.PutUint32(group))...)
	}
	return r
}

// hostRules (re)installs the daemon's host table (name): traffic from its
// sandboxes' host links (fbx*, in link group group) may reach only the
// egress service's ports and replies; nothing is forwarded to or from
// them; and the egress ports on any sandbox gateway refuse what does not
// come from a sandbox link. It replaces a previous version of the same
// table atomically and touches no other table: other daemons' links are
// in their own tables.
func hostRules(name string, group uint32) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddTable(t)
	c.DelTable(t) // with the add first, this never fails: a clean start
	t = c.AddTable(t)
	add := func(ch *nftables.Chain, r rule) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r}) }

	in := c.AddChain(&nftables.Chain{Name: "sandboxes_in", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	fromSandbox := sandboxLinks(expr.MetaKeyIIFNAME, expr.MetaKeyIIFGROUP, group)
	tcp, udp := l4(unix.IPPROTO_TCP), l4(unix.IPPROTO_UDP)
	// The egress service is for sandboxes only: its ports on the gateways
	// refuse anything that does not come from a sandbox link (another
	// machine routing to 10.231/16, a process on the host).
	notFromSandbox := rule{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(hostInterfacePrefix)}}
	toGateways := ipv4().then(inSubnet4(subnet)...)
	for _, p := range []uint16{listenProxyPort, listenHTTPPort, listenTLSPort, listenDNSPort} {
		add(in, toGateways.then(notFromSandbox...).then(tcp...).then(dport(p)...).then(drop()))
	}
	add(in, toGateways.then(notFromSandbox...).then(udp...).then(dport(listenDNSPort)...).then(drop()))
	// A sandbox reaches the egress service on its own gateway only (one
	// whose stack the daemon does not fence inside, gVisor's, could
	// otherwise address another sandbox's listeners and get its policy).
	own := fromSandbox.then(toOwnGateway()...)
	for _, p := range []uint16{listenProxyPort, listenHTTPPort, listenTLSPort, listenDNSPort} {
		add(in, own.then(tcp...).then(dport(p)...).then(accept()))
	}
	add(in, own.then(udp...).then(dport(listenDNSPort)...).then(accept()))
	add(in, fromSandbox.then(established()...).then(accept()))
	add(in, fromSandbox.then(tcp...).then(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))
	add(in, fromSandbox.then(refuse()...))

	// The same redirects as in a sandbox's own namespace, on the host side
	// of its link: a gVisor sandbox's network stack is in its Sentry
	// (runtime/runsc), whose frames leave by the link without passing the
	// namespace's rules. For the runc tier these never match (its
	// namespace has already sent those packets to the listen ports).
	// Nor may it send from an address that is not its link's.
	guard := c.AddChain(&nftables.Chain{Name: "sandboxes_source", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle})
	add(guard, fromSandbox.then(spoofed()...).then(drop()))
	pre := c.AddChain(&nftables.Chain{Name: "sandboxes_redirect", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	add(pre, fromSandbox.then(ipv4()...).then(tcp...).then(dport(80)...).then(redirect(listenHTTPPort)...))
	add(pre, fromSandbox.then(ipv4()...).then(tcp...).then(dport(443)...).then(redirect(listenTLSPort)...))
	add(pre, fromSandbox.then(toGateways...).then(tcp...).then(dport(ProxyPort)...).then(redirect(listenProxyPort)...))
	add(pre, fromSandbox.then(toGateways...).then(tcp...).then(dport(53)...).then(redirect(listenDNSPort)...))
	add(pre, fromSandbox.then(toGateways...).then(udp...).then(dport(53)...).then(redirect(listenDNSPort)...))
	// Any other TCP connection is sent to a port of its own gateway on
	// which the input chain answers with a reset, as the namespace's rules
	// do for the runc tier (a host that does not forward would drop it
	// unanswered: a timeout instead of a refusal).
	add(pre, fromSandbox.then(ipv4()...).then(tcp...).then(notToOwnGateway()...).then(redirect(refusedPort)...))

	fwd := c.AddChain(&nftables.Chain{Name: "sandboxes_forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	add(fwd, fromSandbox.then(tcp...).then(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))
	add(fwd, fromSandbox.then(refuse()...))
	add(fwd, sandboxLinks(expr.MetaKeyOIFNAME, expr.MetaKeyOIFGROUP, group).then(drop()))

	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables host rules: %w", err)
	}
	return nil
}

// RemoveHostRules deletes the host table name (a daemon's, when it is
// uninstalled); a table that is not there is fine.
func RemoveHostRules(name string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddTable(t) // with the add first, the delete never fails
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove nftables table %s: %w", name, err)
	}
	return nil
}
