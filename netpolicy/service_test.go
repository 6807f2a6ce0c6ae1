package netpolicy

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/forkbox/forkbox/internal/testnet"
)

// inNamespace runs fn on a thread inside the network namespace at path:
// sockets fn opens belong to that namespace, as a sandbox's would.
func inNamespace(t *testing.T, path string, fn func()) {
	t.Helper()
	if err := testnet.Run(path, func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestServiceFencesTheSandboxNamespace(t *testing.T) {
	host := testnet.NewHost(t, "198.51.100.20")
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello via %s", r.Host)
	}))
	open := host.Listen(t, 22) // a port no rule allows
	go func() {
		for {
			c, err := open.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("reached\n"))
			c.Close()
		}
	}()
	// A host service on all addresses (as forkbox's API might be).
	hostSvc, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostSvc.Close()
	hostPort := hostSvc.Addr().(*net.TCPAddr).Port

	opts := testServiceOptions(t)
	opts.Resolver = MapResolver{"allowed.test": {host.Addr}, "other.test": {host.Addr}}
	s, err := NewService(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	var events sync.Map // the sink is called from many goroutines
	rules, _ := ParseAllow("allow", []string{"allowed.test:80"})
	a, err := s.Attach("svc1test", &Policy{Allow: rules}, func(ev Event) { events.Store(ev.Time, ev) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Detach("svc1test") })
	if _, err := s.Attach("svc1test", &Policy{Allow: rules}, nil, nil); err == nil {
		t.Error("a second Attach of one session succeeded")
	}

	httpStatus := func(dst, hostHeader string) (int, error) {
		c, err := net.DialTimeout("tcp", dst, 3*time.Second)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hostHeader)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		return resp.StatusCode, nil
	}
	refused := func(err error) bool {
		return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
			errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENETUNREACH)
	}

	inNamespace(t, a.NetnsPath, func() {
		// Port 80 anywhere goes through the transparent proxy.
		if st, err := httpStatus("198.51.100.20:80", "allowed.test"); st != 200 {
			t.Errorf("transparent HTTP to an allowed name: %d %v", st, err)
		}
		if st, err := httpStatus("198.51.100.20:80", "other.test"); st != 403 {
			t.Errorf("transparent HTTP to another name: %d %v, want 403", st, err)
		}
		// The explicit proxy on the gateway.
		if st, err := httpStatus(net.JoinHostPort(a.Gateway.String(), "3128"), "x"); st != 400 {
			t.Errorf("the proxy port answers %d %v, want 400 for an origin-form request", st, err)
		}
		// Direct connections anywhere else are refused at once.
		for _, dst := range []string{
			"198.51.100.20:22",                                         // the internet, another port
			net.JoinHostPort(a.Gateway.String(), "22"),                 // the host through the gateway
			net.JoinHostPort(a.Gateway.String(), fmt.Sprint(hostPort)), // a host service
			fmt.Sprintf("127.0.0.1:%d", hostPort),                      // its own loopback is not the host's
			"169.254.169.254:80",                                       // metadata: port 80 is proxied, and refused there
		} {
			c, err := net.DialTimeout("tcp", dst, 3*time.Second)
			if err == nil {
				c.SetDeadline(time.Now().Add(3 * time.Second))
				if dst == "169.254.169.254:80" {
					fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n")
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil || resp.StatusCode != 403 {
						t.Errorf("metadata address: %v %v, want 403", resp, err)
					}
				} else {
					b := make([]byte, 16)
					n, _ := c.Read(b)
					t.Errorf("connected to %s (read %q)", dst, b[:n])
				}
				c.Close()
				continue
			}
			if !refused(err) {
				t.Errorf("%s: %v, want refused at once", dst, err)
			}
		}
		// DNS: the gateway answers; any other server is unreachable.
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		resp, err := dns.Exchange(m, net.JoinHostPort(a.Gateway.String(), "53"))
		if err != nil || len(resp.Answer) != 1 {
			t.Errorf("DNS through the gateway: %v %v", resp, err)
		}
		cl := &dns.Client{Timeout: 2 * time.Second}
		if _, _, err := cl.Exchange(m, "198.51.100.20:53"); err == nil {
			t.Error("DNS to another server got an answer")
		}
		cl.Net = "tcp"
		if _, _, err := cl.Exchange(m, "198.51.100.20:53"); err == nil {
			t.Error("DNS over TCP to another server got an answer")
		}
	})

	// The egress service is for the sandbox only: from the host (or any
	// other machine) its ports do not answer.
	for _, port := range []int{listenProxyPort, listenHTTPPort, listenTLSPort, listenDNSPort} {
		if c, err := net.DialTimeout("tcp", netip.AddrPortFrom(a.Gateway, uint16(port)).String(), time.Second); err == nil {
			c.Close()
			t.Errorf("egress port %d answers a connection from the host", port)
		}
	}

	// Nothing is left after Detach.
	link := HostLinkName("svc1test")
	if err := s.Detach("svc1test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.NetnsPath); !os.IsNotExist(err) {
		t.Errorf("namespace file after Detach: %v", err)
	}
	if ifs, _ := net.Interfaces(); strings.Contains(fmt.Sprint(ifs), link) {
		t.Errorf("link %s after Detach", link)
	}
	// The slot is free again: its gateway is on no link (slots are taken
	// lowest free first, but other daemons' and tests' sandboxes on this
	// host take and free slots meanwhile, so the next attach need not get
	// the same one), and another attach works.
	if hostGateways()[a.Gateway] {
		t.Errorf("gateway %s still on a link after Detach", a.Gateway)
	}
	if _, err := s.Attach("svc2test", &Policy{Allow: rules}, nil, nil); err != nil {
		t.Fatal(err)
	}
	defer s.Detach("svc2test")
}

// testServiceOptions are a service's options with a table and link group
// of the test's own (removed when it ends), as a daemon has.
func testServiceOptions(t *testing.T) ServiceOptions {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	table := "forkbox-test-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if err := RemoveHostRules(table); err != nil {
			t.Error(err)
		}
	})
	return ServiceOptions{Dir: t.TempDir(), TestNetworks: testNetworks, Table: table,
		LinkGroup: binary.BigEndian.Uint32(b[:]) | 1<<31}
}

// hostTableRules returns the user data of every rule in the host table
// name's input chain (nil when the table is not there).
func hostTableRules(t *testing.T, name string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListTableOfFamily(name, nftables.TableFamilyINet); err != nil {
		return nil
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	rules, err := c.GetRules(tbl, &nftables.Chain{Name: "sandboxes_in", Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, r := range rules {
		out = append(out, string(r.UserData))
	}
	return out
}

// addProbeRule appends a rule that matches nothing, tagged tag, to the
// host table name's input chain: it survives only while nobody replaces
// the table.
func addProbeRule(t *testing.T, name, tag string) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: "sandboxes_in", Table: tbl},
		Exprs: ifname(expr.MetaKeyIIFNAME, "fbxprobe-none", false).then(drop()), UserData: []byte(tag)})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestServicesOfTwoDaemons: two daemons' egress services on one host
// have a table each; a restart of one (its NewService) replaces its own
// table and leaves the other's as it was (a rule only the test added
// survives); each link is in its own daemon's group; and attaches of both
// at once never share a gateway (the host-wide slot lock).
func TestServicesOfTwoDaemons(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables)")
	}
	optsA, optsB := testServiceOptions(t), testServiceOptions(t)
	a, err := NewService(optsA)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	b, err := NewService(optsB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	addProbeRule(t, optsA.Table, "probe-a")
	addProbeRule(t, optsB.Table, "probe-b")

	rules, _ := ParseAllow("allow", []string{"allowed.test:80"})
	const n = 6
	var wg sync.WaitGroup
	gateways := make(chan string, 2*n)
	for i := 0; i < n; i++ {
		for _, sv := range []struct {
			s   *Service
			tag string
		}{{a, "a"}, {b, "b"}} {
			id := fmt.Sprintf("two%s%dtest", sv.tag, i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				at, err := sv.s.Attach(id, &Policy{Allow: rules}, nil, nil)
				if err != nil {
					t.Error(err)
					return
				}
				t.Cleanup(func() { sv.s.Detach(id) })
				gateways <- at.Gateway.String()
			}()
		}
	}
	wg.Wait()
	close(gateways)
	seen := map[string]bool{}
	for gw := range gateways {
		if seen[gw] {
			t.Errorf("two attaches got gateway %s", gw)
		}
		seen[gw] = true
	}
	for i := 0; i < n; i++ {
		for _, c := range []struct {
			tag   string
			group uint32
		}{{"a", optsA.LinkGroup}, {"b", optsB.LinkGroup}} {
			link := HostLinkName(fmt.Sprintf("two%s%dtest", c.tag, i))
			if g, ok, err := linkGroup(link); err != nil || !ok || g != c.group {
				t.Errorf("link %s: group %d %v %v, want %d", link, g, ok, err, c.group)
			}
		}
	}

	// A restarts: its table is new, B's untouched.
	a.Close()
	a2, err := NewService(optsA)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a2.Close)
	if got := hostTableRules(t, optsA.Table); strings.Contains(strings.Join(got, ","), "probe-a") {
		t.Errorf("A's restart kept its old table: %q", got)
	}
	if got := hostTableRules(t, optsB.Table); !strings.Contains(strings.Join(got, ","), "probe-b") {
		t.Errorf("A's restart replaced B's table: rules %q", got)
	}
}

func TestSlotAddresses(t *testing.T) {
	for _, slot := range []int{0, 1, 63, 64, 1000, maxSlots - 1} {
		gw, sb := slotAddrs(slot)
		if !subnet.Contains(gw) || !subnet.Contains(sb) || sb != gw.Next() {
			t.Errorf("slot %d: %s %s", slot, gw, sb)
		}
		if got, ok := slotOf(gw); !ok || got != slot {
			t.Errorf("slotOf(%s) = %d %v, want %d", gw, got, ok, slot)
		}
	}
	if _, ok := slotOf(netip.MustParseAddr("10.231.0.2")); ok {
		t.Error("a sandbox address is taken for a gateway")
	}
	if n := len(HostLinkName("abcdefghijklmnopqrst")); n > 14 {
		t.Errorf("host link name is %d bytes; its peer (+1) must fit IFNAMSIZ-1", n)
	}
}

// TestAttachFailureLeavesNothing: a namespace that cannot be made (the
// caller's maker fails, as a user namespace holder can) is an error, not
// a panic of the undo, and leaves no link, file or slot behind.
func TestAttachFailureLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables)")
	}
	dir := t.TempDir()
	s, err := NewService(ServiceOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	boom := errors.New("no namespace today")
	for i := 0; i < 2; i++ {
		_, err := s.Attach("svcfail", &Policy{}, nil, func(string) error { return boom })
		if !errors.Is(err, boom) {
			t.Fatalf("attach %d: %v, want the maker's error", i, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "svcfail")); !os.IsNotExist(err) {
		t.Errorf("the namespace file is left: %v", err)
	}
	if _, err := netlink.LinkByName(HostLinkName("svcfail")); err == nil {
		t.Error("the host link is left")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.slots) != 0 || len(s.active) != 0 {
		t.Errorf("slots %v, active %v after failed attaches", s.slots, s.active)
	}
}
