// Package testnet makes "internet" hosts for tests on this machine: each
// Host is a network namespace joined to the host by a veth pair, with one
// address from the documentation range 198.51.100.0/24 and a host route
// (/32) to it, so that no test packet can leave the machine even
// when the code under test is wrong. It needs root.
package testnet

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Host is a test host in its own network namespace.
type Host struct {
	// Addr is the host's address.
	Addr netip.Addr
	ns   netns.NsHandle
	link string // the host-side veth
	cert *x509.Certificate
}

// TLSCertificate is the certificate of the last ServeTLS (nil before one).
func (h *Host) TLSCertificate() *x509.Certificate { return h.cert }

// testRange is where test hosts live: a documentation range (RFC 5737)
// that nothing on these machines routes elsewhere. Only host routes (/32)
// inside it are ever added.
var testRange = netip.MustParsePrefix("198.51.100.0/24")

// NewHost makes a test host at addr (which must be in 198.51.100.0/24) and
// removes it when t ends. It skips t when not root.
func NewHost(t testing.TB, addr string) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("testnet: needs root to make network namespaces")
	}
	h, err := Start(addr)
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// Start makes a host at addr (in 198.51.100.0/24): a new network namespace
// with the address, a veth pair to this one and a host route (/32) to it.
// The caller must Close it. It needs root.
func Start(addr string) (h *Host, retErr error) {
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is4() || !testRange.Contains(a) {
		return nil, fmt.Errorf("%q is not an address in %s", addr, testRange)
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	tag := hex.EncodeToString(rnd[:])
	// (made is what to undo on an error: h, the result, is nil by then.)
	made := &Host{Addr: a, link: "fbt" + tag + "h", ns: -1}
	h = made
	peer := "fbt" + tag + "p"
	defer func() {
		if retErr != nil {
			_ = made.Close()
		}
	}()

	ns, err := newNamespace()
	if err != nil {
		return nil, err
	}
	h.ns = ns
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.link}, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("add veth: %w", err)
	}
	pl, err := netlink.LinkByName(peer)
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetNsFd(pl, int(ns)); err != nil {
		return nil, fmt.Errorf("move veth: %w", err)
	}
	hl, err := netlink.LinkByName(h.link)
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		return nil, err
	}
	host32 := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: hl.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: host32}); err != nil {
		return nil, fmt.Errorf("host route: %w", err)
	}

	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err == nil {
		err = nh.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("lo: %w", err)
	}
	pl, err = nh.LinkByName(peer)
	if err != nil {
		return nil, err
	}
	if err := nh.AddrAdd(pl, &netlink.Addr{IPNet: host32}); err != nil {
		return nil, fmt.Errorf("address: %w", err)
	}
	if err := nh.LinkSetUp(pl); err != nil {
		return nil, err
	}
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil {
		return nil, fmt.Errorf("default route: %w", err)
	}
	return h, nil
}

// Close removes the host: its veth pair (and with it the host route) and
// its namespace. Closing twice is fine.
func (h *Host) Close() error {
	var err error
	if l, lerr := netlink.LinkByName(h.link); lerr == nil {
		err = netlink.LinkDel(l)
	}
	if h.ns >= 0 {
		h.ns.Close()
		h.ns = -1
	}
	return err
}

// newNamespace makes a network namespace and returns a handle to it.
func newNamespace() (netns.NsHandle, error) {
	var ns netns.NsHandle
	err := onThreadIn(func() (err error) { ns, err = netns.New(); return err }, func() error { return nil })
	return ns, err
}

// Run runs fn on an OS thread inside the network
// namespace at path (a bind-mounted namespace file or /proc/PID/ns/net):
// sockets fn opens belong to that namespace.
func Run(path string, fn func() error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return onThreadIn(func() error { return netns.Set(ns) }, fn)
}

// onThreadIn runs fn on a locked OS thread after enter has moved that
// thread into another network namespace, then moves it back. A thread that
// cannot be moved back stays locked, so it ends with its goroutine instead
// of running other goroutines in the wrong namespace.
func onThreadIn(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			// Set and New leave the thread where it was when they fail.
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		fnErr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return to the original namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// ListenTCP opens a TCP listener on the host's address and port, inside
// its namespace.
func (h *Host) ListenTCP(port int) (net.Listener, error) {
	var l net.Listener
	err := onThreadIn(func() error { return netns.Set(h.ns) }, func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(h.Addr, uint16(port)).String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s:%d: %w", h.Addr, port, err)
	}
	return l, nil
}

// ListenUDP opens a UDP socket on the host's address and port, inside its
// namespace.
func (h *Host) ListenUDP(port int) (net.PacketConn, error) {
	var c net.PacketConn
	err := onThreadIn(func() error { return netns.Set(h.ns) }, func() (err error) {
		c, err = net.ListenPacket("udp", netip.AddrPortFrom(h.Addr, uint16(port)).String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on udp %s:%d: %w", h.Addr, port, err)
	}
	return c, nil
}

// Listen is ListenTCP for a test: it fails t on an error and closes the
// listener when t ends.
func (h *Host) Listen(t testing.TB, port int) net.Listener {
	t.Helper()
	l, err := h.ListenTCP(port)
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// ServeHTTP serves handler over plain HTTP on port.
func (h *Host) ServeHTTP(t testing.TB, port int, handler http.Handler) {
	t.Helper()
	srv := &httptest.Server{Listener: h.Listen(t, port), Config: &http.Server{Handler: handler}}
	srv.Start()
	t.Cleanup(srv.Close)
}

// ServeTLS serves handler over TLS on port with a certificate for names
// (DNS names or IP literals), and returns a pool that trusts it.
func (h *Host) ServeTLS(t testing.TB, port int, handler http.Handler, names ...string) *x509.CertPool {
	t.Helper()
	cert, pool := SelfSigned(t, names...)
	h.cert = cert.Leaf
	srv := &httptest.Server{Listener: h.Listen(t, port), Config: &http.Server{Handler: handler},
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return pool
}

// SelfSigned makes a self-signed certificate for names (DNS names or IP
// literals), valid for an hour, and a pool that trusts it.
func SelfSigned(t testing.TB, names ...string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "forkbox test host"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
