package netpolicy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
)

// ServiceOptions configure a daemon's egress service.
type ServiceOptions struct {
	// Dir holds the sandboxes' network namespace files (created 0700).
	Dir string
	// Resolver resolves names for every sandbox; nil is the host's
	// resolver (net.DefaultResolver).
	Resolver Resolver
	// Log receives errors; nil is slog.Default().
	Log *slog.Logger
	// Table is the daemon's own nftables table on the host and LinkGroup
	// the interface group of its sandboxes' host links, by which the table
	// fences them and only them (datadir.HostNames); "" and 0 are the
	// table and the links of daemons from before, which fenced every
	// daemon's links in one table.
	Table     string
	LinkGroup uint32
	// TestNetworks are documentation-range prefixes (RFC 5737, RFC 3849,
	// RFC 9637) the egress may reach although the blocklist refuses those
	// ranges: tests put their hosts there. Empty in production; a prefix
	// outside the documentation ranges makes NewService fail.
	TestNetworks []netip.Prefix
}

// Service gives sandboxes their networks: a namespace each, wired to the
// host, fenced by nftables, served by an Egress.
type Service struct {
	opts  ServiceOptions
	block *Blocklist

	mu     sync.Mutex
	slots  map[int]string         // slot → session id
	active map[string]*Attachment // by session id
}

// NewService prepares the host (its own nftables table, replaced
// atomically; no other daemon's is touched) and returns the service. The sandbox subnet, the host's own addresses and the networks
// the host is on join the blocklist.
func NewService(opts ServiceOptions) (*Service, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.Table == "" {
		opts.Table = LegacyHostTable
	}
	block, err := NewBlocklist(map[netip.Prefix]string{subnet: "the sandboxes' own network"}).WithHostNetworks().
		WithTestNetworks(opts.TestNetworks)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	if err := hostRules(opts.Table, opts.LinkGroup); err != nil {
		return nil, err
	}
	return &Service{opts: opts, block: block, slots: map[int]string{}, active: map[string]*Attachment{}}, nil
}

// Attachment is one sandbox's network.
type Attachment struct {
	// NetnsPath is the namespace file to give runc.
	NetnsPath string
	// Gateway is the host side's address: the proxy and DNS server.
	Gateway netip.Addr
	// Addr is the sandbox's address.
	Addr netip.Addr

	id     string
	slot   int
	egress *Egress
}

// Resolv is the sandbox's /etc/resolv.conf: the gateway is its only
// resolver.
func (a *Attachment) Resolv() []byte {
	return fmt.Appendf(nil, "nameserver %s\noptions ndots:0 timeout:2 attempts:2\n", a.Gateway)
}

// Env is the proxy environment of the sandbox's processes (both cases,
// since programs differ in which they read).
func (a *Attachment) Env() []string {
	proxy := fmt.Sprintf("http://%s:%d", a.Gateway, ProxyPort)
	out := []string{"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1"}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		out = append(out, k+"="+proxy)
	}
	return out
}

// OpenBytes is the bytes moved so far by connections still open (ended
// ones are in the events).
func (a *Attachment) OpenBytes() int64 { return a.egress.meter.openBytes() }

// Attach makes session id's network for policy p; events go to sink. On
// error nothing is left behind. ErrResourceExhausted when every address
// slot is taken; ErrConflict when id already has a network.
//
// makeNetns makes the namespace file at the path it is given (a new file):
// a sandbox that joins a user namespace of its own needs a network
// namespace owned by that user namespace (userns.Create makes both). nil
// makes one owned by the host's user namespace. Either way root in the
// sandbox cannot change the namespace's links, routes or rules: its
// capabilities never include CAP_NET_ADMIN.
func (s *Service) Attach(id string, p *Policy, sink Sink, makeNetns func(path string) error) (*Attachment, error) {
	// Other daemons choose slots too: hold the host-wide lock from
	// reading the host's gateways until this link has its own.
	unlock, err := lockSlots()
	if err != nil {
		return nil, err
	}
	defer unlock()
	s.mu.Lock()
	if _, ok := s.active[id]; ok {
		s.mu.Unlock()
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s already has a network", id)
	}
	// A slot whose gateway is already on the host (another daemon's, or
	// a leftover) is skipped too.
	onHost := hostGateways()
	slot := -1
	for i := 0; i < maxSlots; i++ {
		gw, _ := slotAddrs(i)
		if _, used := s.slots[i]; !used && !onHost[gw] {
			slot = i
			break
		}
	}
	if slot < 0 {
		s.mu.Unlock()
		return nil, errdefs.Newf(errdefs.ErrResourceExhausted, "all %d sandbox network slots are in use", maxSlots)
	}
	s.slots[slot] = id
	s.mu.Unlock()

	if makeNetns == nil {
		makeNetns = createNamespace
	}
	a, err := s.attach(id, slot, p, sink, makeNetns)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		delete(s.slots, slot)
		return nil, err
	}
	s.active[id] = a
	return a, nil
}

func (s *Service) attach(id string, slot int, p *Policy, sink Sink, makeNetns func(string) error) (_ *Attachment, err error) {
	gw, sb := slotAddrs(slot)
	// a, not the result (nil on every error return), is what the undo reads.
	a := &Attachment{NetnsPath: filepath.Join(s.opts.Dir, id), Gateway: gw, Addr: sb, id: id, slot: slot}
	link := HostLinkName(id)
	defer func() {
		if err != nil {
			if a.egress != nil {
				a.egress.Close()
			}
			_ = deleteLink(link)
			_ = removeNamespace(a.NetnsPath)
		}
	}()
	// A link by that name is a leftover of a crash of this daemon when it
	// is in this daemon's group; anyone else's is left alone.
	if group, exists, err := linkGroup(link); err != nil {
		return nil, err
	} else if exists && group != s.opts.LinkGroup {
		return nil, errdefs.Newf(errdefs.ErrConflict, "host link %s of session %s exists in link group %d, not this daemon's", link, id, group)
	} else if exists {
		if err := deleteLink(link); err != nil {
			return nil, err
		}
	}
	if err := makeNetns(a.NetnsPath); err != nil {
		return nil, err
	}
	if err := wire(a.NetnsPath, link, s.opts.LinkGroup, gw, sb); err != nil {
		return nil, err
	}
	ns, err := os.Open(a.NetnsPath)
	if err != nil {
		return nil, err
	}
	err = sandboxRules(int(ns.Fd()), gw)
	ns.Close()
	if err != nil {
		return nil, err
	}
	if err := s.serve(a, p, sink, 0); err != nil {
		return nil, err
	}
	return a, nil
}

// serve starts a's Egress on its gateway's ports.
func (s *Service) serve(a *Attachment, p *Policy, sink Sink, usedBytes int64) error {
	e := New(Config{SessionID: a.id, Policy: p, Blocklist: s.block, Resolver: s.opts.Resolver, Sink: sink,
		Log: s.opts.Log.With("session", a.id)})
	e.meter.add(usedBytes)
	ls, udp, err := listenEgress(a.Gateway)
	if err != nil {
		// A previous daemon may still hold the ports (a restart that
		// overlaps its shutdown): the caller may try again.
		if errors.Is(err, syscall.EADDRINUSE) {
			return errdefs.Newf(errdefs.ErrUnavailable, "%v", err)
		}
		return err
	}
	e.ServeProxy(ls[0])
	e.ServeTransparentHTTP(ls[1])
	e.ServeTransparentTLS(ls[2])
	e.ServeDNS(udp, ls[3])
	a.egress = e
	return nil
}

// listenEgress opens the egress service's sockets on gw: TCP for the
// proxy, transparent HTTP, transparent TLS and DNS, and UDP for DNS. On
// error none stays open.
func listenEgress(gw netip.Addr) ([]net.Listener, net.PacketConn, error) {
	var ls []net.Listener
	closeAll := func() {
		for _, l := range ls {
			l.Close()
		}
	}
	for _, port := range []int{listenProxyPort, listenHTTPPort, listenTLSPort, listenDNSPort} {
		l, err := net.Listen("tcp", netip.AddrPortFrom(gw, uint16(port)).String())
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("egress listener: %w", err)
		}
		ls = append(ls, l)
	}
	udp, err := net.ListenPacket("udp", netip.AddrPortFrom(gw, listenDNSPort).String())
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("egress DNS listener: %w", err)
	}
	return ls, udp, nil
}

// Adopt takes over session id's network after a daemon restart: its
// namespace file and host link are still there (with their rules); the
// link joins this daemon's link group (a link made by a daemon from
// before link groups moves from the shared table's fence to this
// daemon's), and the Egress is started again, with usedBytes (what the
// session moved before, in bytes) already counted against its quota. ErrNotFound when
// the network is gone; ErrUnavailable when the egress ports are still held
// (by a previous daemon that is shutting down): try again later.
func (s *Service) Adopt(id string, p *Policy, sink Sink, usedBytes int64) (*Attachment, error) {
	path := filepath.Join(s.opts.Dir, id)
	if _, err := os.Stat(path); err != nil {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "network namespace of session %s: %v", id, err)
	}
	gw, err := linkGateway(HostLinkName(id))
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "network of session %s: %v", id, err)
	}
	if err := setLinkGroup(HostLinkName(id), s.opts.LinkGroup); err != nil {
		return nil, err
	}
	slot, _ := slotOf(gw)
	_, sb := slotAddrs(slot)
	s.mu.Lock()
	if other, used := s.slots[slot]; used && other != id {
		s.mu.Unlock()
		return nil, errdefs.Newf(errdefs.ErrConflict, "network slot of session %s is taken by %s", id, other)
	}
	s.slots[slot] = id
	s.mu.Unlock()
	a := &Attachment{NetnsPath: path, Gateway: gw, Addr: sb, id: id, slot: slot}
	if err := s.serve(a, p, sink, usedBytes); err != nil {
		s.mu.Lock()
		delete(s.slots, slot)
		s.mu.Unlock()
		return nil, err
	}
	s.mu.Lock()
	s.active[id] = a
	s.mu.Unlock()
	return a, nil
}

// Detach removes session id's network: its Egress (open connections are
// cut), host link and namespace. Detaching a session without a network
// removes whatever is left of one and is not an error.
func (s *Service) Detach(id string) error {
	s.mu.Lock()
	a := s.active[id]
	delete(s.active, id)
	if a != nil {
		delete(s.slots, a.slot)
	}
	s.mu.Unlock()
	if a != nil && a.egress != nil {
		a.egress.Close()
	}
	return errors.Join(deleteLink(HostLinkName(id)), removeNamespace(filepath.Join(s.opts.Dir, id)))
}

// Sweep detaches every network on the host whose session live reports
// false (leftovers of sessions that ended while the daemon was down).
func (s *Service) Sweep(live func(id string) bool) error {
	entries, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !live(e.Name()) {
			errs = append(errs, s.Detach(e.Name()))
		}
	}
	return errors.Join(errs...)
}

// RemoveNetworks removes every sandbox network whose namespace file is in
// dir (a daemon's netns directory): the namespace and its host link. For
// forkbox down, after the sandboxes are gone, with or without a Service.
func RemoveNetworks(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, deleteLink(HostLinkName(e.Name())), removeNamespace(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// RetireLegacyHostTable removes LegacyHostTable, the table every daemon
// shared before each had its own, once no host link of such a daemon is
// left (a link in no group): a daemon calls it after adopting its own
// sandboxes (whose links then join its group), and forkbox down after
// removing them. It reports whether the table is gone.
func RetireLegacyHostTable() (bool, error) {
	n, err := legacyLinks()
	if err != nil || n > 0 {
		return false, err
	}
	if err := RemoveHostRules(LegacyHostTable); err != nil {
		return false, err
	}
	return true, nil
}

// Close stops every Egress (at daemon shutdown); namespaces, links and
// rules stay for the sandboxes, which keep running, and the next daemon
// adopts them.
func (s *Service) Close() {
	s.mu.Lock()
	active := s.active
	s.active = map[string]*Attachment{}
	s.slots = map[int]string{}
	s.mu.Unlock()
	for _, a := range active {
		a.egress.Close()
	}
}
