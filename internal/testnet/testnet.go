// Package testnet makes "internet" hosts for tests on this machine: each
// Host is a network namespace joined to the host by a veth pair, with one
// address from the documentation ranges (198.51.100.0/24, 203.0.113.0/24)
// and a host route to it, so that no test packet can leave the machine even
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

// NewHost makes a test host at addr (which must be in 198.51.100.0/24 or
// 203.0.113.0/24) and removes it when t ends. It skips t when not root.
func NewHost(t testing.TB, addr string) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("testnet: needs root to make network namespaces")
	}
	a := netip.MustParseAddr(addr)
	if !netip.MustParsePrefix("198.51.100.0/24").Contains(a) && !netip.MustParsePrefix("203.0.113.0/24").Contains(a) {
		t.Fatalf("testnet: %s is not in a documentation range", a)
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	tag := hex.EncodeToString(rnd[:])
	h := &Host{Addr: a, link: "fbt" + tag + "h"}
	peer := "fbt" + tag + "p"

	ns, err := newNamespace()
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	h.ns = ns
	t.Cleanup(func() { h.ns.Close() })

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.link}, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("testnet: add veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(h.link); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	pl, err := netlink.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(pl, int(ns)); err != nil {
		t.Fatalf("testnet: move veth: %v", err)
	}
	hl, err := netlink.LinkByName(h.link)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		t.Fatal(err)
	}
	bits := a.BitLen()
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: hl.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}); err != nil {
		t.Fatalf("testnet: host route: %v", err)
	}

	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err == nil {
		err = nh.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("testnet: lo: %v", err)
	}
	pl, err = nh.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.AddrAdd(pl, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}); err != nil {
		t.Fatalf("testnet: address: %v", err)
	}
	if err := nh.LinkSetUp(pl); err != nil {
		t.Fatal(err)
	}
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil {
		t.Fatalf("testnet: default route: %v", err)
	}
	return h
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

// Listen opens a TCP listener on the host's address and port, inside its
// namespace.
func (h *Host) Listen(t testing.TB, port int) net.Listener {
	t.Helper()
	var l net.Listener
	err := onThreadIn(func() error { return netns.Set(h.ns) }, func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(h.Addr, uint16(port)).String())
		return err
	})
	if err != nil {
		t.Fatalf("testnet: listen on %s:%d: %v", h.Addr, port, err)
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
