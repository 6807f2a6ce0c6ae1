package netpolicy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// dnsTTL is the TTL of every answer, in seconds: short, so that a sandbox
// re-asks (and is re-checked) often.
const dnsTTL = 30

// ServeDNS serves the sandbox's resolver on a UDP socket and a TCP
// listener (either may be nil). It answers A and AAAA queries for names the
// policy lets the sandbox reach, with the addresses Egress resolved itself
// minus the blocked ones; every other name is NXDOMAIN and nothing is asked
// upstream for it, which closes DNS tunnelling through other names. Every
// query is an Event of kind "dns".
func (e *Egress) ServeDNS(udp net.PacketConn, tcp net.Listener) {
	h := dns.HandlerFunc(e.answer)
	// Stopping closes the sockets too: Shutdown alone does nothing to a
	// server that has not started serving yet.
	if udp != nil {
		srv := &dns.Server{PacketConn: udp, Handler: h}
		e.start(func() { srv.ActivateAndServe() }, func() { srv.Shutdown(); udp.Close() })
	}
	if tcp != nil {
		tcp = e.capping(tcp, "dns")
		srv := &dns.Server{Listener: tcp, Handler: h, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
		e.start(func() { srv.ActivateAndServe() }, func() { srv.Shutdown(); tcp.Close() })
	}
}

func (e *Egress) answer(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	defer w.WriteMsg(resp)
	if len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		resp.Rcode = dns.RcodeNotImplemented
		return
	}
	q := req.Question[0]
	ev := Event{Time: time.Now(), Kind: "dns", Host: q.Name, Port: 53}
	if len(q.Name) > 1 {
		ev.Host = q.Name[:len(q.Name)-1]
	}
	deny := func(rcode int, reason string) {
		resp.Rcode = rcode
		ev.Decision, ev.Reason = DecisionDeny, reason
		e.cfg.Sink(ev)
	}
	if why := e.meter.admitQuery(); why != "" {
		resp.Rcode = dns.RcodeRefused
		e.refused("dns", why)
		return
	}
	if q.Qclass != dns.ClassINET || !e.policy().Resolvable(ev.Host) {
		deny(dns.RcodeNameError, "name not in the allow-list")
		return
	}
	network := ""
	switch q.Qtype {
	case dns.TypeA:
		network = "ip4"
	case dns.TypeAAAA:
		network = "ip6"
	default:
		// An allowed name, another type: no data (NOERROR, no answer).
		ev.Decision, ev.Reason = DecisionAllow, "no data for type "+dns.TypeToString[q.Qtype]
		e.cfg.Sink(ev)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.DialTimeout)
	addrs, err := e.cfg.Resolver.LookupNetIP(ctx, network, ev.Host)
	cancel()
	var blockedWhy string
	for _, a := range addrs {
		a = a.Unmap()
		if why := e.cfg.Blocklist.Blocked(a, 0); why != "" {
			blockedWhy = why
			continue
		}
		if ev.Addr == "" {
			ev.Addr = a.String()
		}
		hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: dnsTTL}
		if a.Is4() {
			resp.Answer = append(resp.Answer, &dns.A{Hdr: hdr, A: net.IP(a.AsSlice())})
		} else {
			resp.Answer = append(resp.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.IP(a.AsSlice())})
		}
	}
	switch {
	case len(resp.Answer) > 0:
		ev.Decision = DecisionAllow
		e.cfg.Sink(ev)
	case blockedWhy != "":
		deny(dns.RcodeNameError, "resolves only to blocked addresses: "+blockedWhy)
	case err != nil && !isNotFound(err):
		deny(dns.RcodeServerFailure, "lookup failed: "+err.Error())
	default:
		// Allowed, but no address of this family: NOERROR, no answer.
		ev.Decision, ev.Reason = DecisionAllow, "no "+network+" address"
		e.cfg.Sink(ev)
	}
}

// isNotFound reports whether err is a resolver's "no such host".
func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// MapResolver resolves names from a fixed table (lowercase name → addresses)
// and nothing else: for tests and for hosts whose names forkbox is told.
type MapResolver map[string][]netip.Addr

// LookupNetIP returns the table's addresses of host of the asked family;
// a *net.DNSError with IsNotFound for names not in the table.
func (m MapResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	n, _ := normalName(host)
	all, ok := m[n]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range all {
		if network == "ip" || (network == "ip4") == a.Unmap().Is4() {
			out = append(out, a)
		}
	}
	return out, nil
}
