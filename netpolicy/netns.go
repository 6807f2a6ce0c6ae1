package netpolicy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// subnet is where sandbox links get their addresses: one /30 per sandbox
// (gateway .1 on the host side, sandbox .2). It is inside 10.0.0.0/8, which
// the blocklist refuses, so sandboxes can never reach each other or the
// gateways through the proxy.
var subnet = netip.MustParsePrefix("10.231.0.0/16")

// maxSlots is how many /30s subnet holds.
const maxSlots = 1 << (32 - 16 - 2)

// slotAddrs returns the gateway and sandbox addresses of slot.
func slotAddrs(slot int) (gw, sb netip.Addr) {
	base := subnet.Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(slot)<<2
	gw = netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n) + 1})
	sb = netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n) + 2})
	return gw, sb
}

// slotOf is the inverse of slotAddrs for a gateway address; false when gw
// is not a gateway of subnet.
func slotOf(gw netip.Addr) (int, bool) {
	if !subnet.Contains(gw) {
		return 0, false
	}
	b := gw.As4()
	if b[3]&3 != 1 {
		return 0, false
	}
	return int(b[2])<<6 | int(b[3])>>2, true
}

// HostLinkName is the host-side interface of sandbox id: "fbx" and 10 hex
// digits of sha256(id), within IFNAMSIZ.
func HostLinkName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hostInterfacePrefix + hex.EncodeToString(sum[:5])
}

// createNamespace makes a network namespace and bind-mounts it on path (a
// new file), so that it outlives every process and can be handed to runc.
func createNamespace(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			runtime.UnlockOSThread()
			return
		}
		mountErr := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread is in the wrong namespace: keep it locked, so
			// that it exits with this goroutine instead of being reused.
			errc <- errors.Join(mountErr, fmt.Errorf("return to the host namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- mountErr
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	return nil
}

// removeNamespace unmounts and removes a namespace file made by
// createNamespace; a missing one is not an error.
func removeNamespace(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// wire connects the namespace at nsPath to the host: a veth pair, hostLink
// (in link group group, so that its daemon's host table fences it) with
// gw/30 on the host, eth0 with sb/30 and a default route via gw in the
// namespace, loopback up.
func wire(nsPath, hostLink string, group uint32, gw, sb netip.Addr) error {
	ns, err := os.Open(nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	peer := hostLink + "p"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostLink, MTU: 1500}, PeerName: peer,
		PeerNamespace: netlink.NsFd(ns.Fd())}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", hostLink, err)
	}
	hl, err := netlink.LinkByName(hostLink)
	if err != nil {
		return err
	}
	// In its group before it is up: no packet of it passes unfenced.
	if err := netlink.LinkSetGroup(hl, int(group)); err != nil {
		return fmt.Errorf("group of %s: %w", hostLink, err)
	}
	mask := net.CIDRMask(30, 32)
	if err := netlink.AddrAdd(hl, &netlink.Addr{IPNet: &net.IPNet{IP: gw.AsSlice(), Mask: mask}}); err != nil {
		return fmt.Errorf("address %s: %w", gw, err)
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		return err
	}
	nh, err := netlink.NewHandleAt(netns.NsHandle(ns.Fd()))
	if err != nil {
		return err
	}
	defer nh.Close()
	pl, err := nh.LinkByName(peer)
	if err != nil {
		return err
	}
	if err := nh.LinkSetName(pl, sandboxInterfaceName); err != nil {
		return err
	}
	if err := nh.AddrAdd(pl, &netlink.Addr{IPNet: &net.IPNet{IP: sb.AsSlice(), Mask: mask}}); err != nil {
		return fmt.Errorf("address %s: %w", sb, err)
	}
	if err := nh.LinkSetUp(pl); err != nil {
		return err
	}
	lo, err := nh.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := nh.LinkSetUp(lo); err != nil {
		return err
	}
	return nh.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: gw.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}})
}

// linkGateway returns the gateway address on an existing host link (to
// adopt a sandbox after a restart).
func linkGateway(hostLink string) (netip.Addr, error) {
	hl, err := netlink.LinkByName(hostLink)
	if err != nil {
		return netip.Addr{}, err
	}
	addrs, err := netlink.AddrList(hl, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			if _, ok := slotOf(ip); ok {
				return ip, nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("link %s has no gateway address", hostLink)
}

// hostGateways returns the sandbox-subnet addresses configured on the
// host's links.
func hostGateways() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return out
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && subnet.Contains(ip) {
			out[ip] = true
		}
	}
	return out
}

// linkGroup returns the link group of an existing host link, and whether
// the link exists.
func linkGroup(hostLink string) (uint32, bool, error) {
	l, err := netlink.LinkByName(hostLink)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return 0, false, nil
		}
		return 0, false, err
	}
	return l.Attrs().Group, true, nil
}

// setLinkGroup puts an existing host link in group.
func setLinkGroup(hostLink string, group uint32) error {
	l, err := netlink.LinkByName(hostLink)
	if err != nil {
		return err
	}
	if l.Attrs().Group == group {
		return nil
	}
	if err := netlink.LinkSetGroup(l, int(group)); err != nil {
		return fmt.Errorf("group of %s: %w", hostLink, err)
	}
	return nil
}

// legacyLinks counts the sandbox host links on the host that are in no
// link group: made by a daemon from before link groups.
func legacyLinks() (int, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range links {
		if a := l.Attrs(); strings.HasPrefix(a.Name, hostInterfacePrefix) && a.Group == 0 {
			n++
		}
	}
	return n, nil
}

// slotLock is a host-wide lock on the sandbox subnet: daemons hold it
// from reading which gateway addresses are on the host until their new
// link has its own, so that two daemons attaching at once never pick the
// same slot.
const slotLock = "/run/forkbox/netslots.lock"

// lockSlots takes slotLock (waiting for it) and returns its release.
func lockSlots() (func(), error) {
	if err := os.MkdirAll(filepath.Dir(slotLock), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(slotLock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", slotLock, err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// deleteLink removes a host link (its peer goes with it); a missing link
// is not an error.
func deleteLink(hostLink string) error {
	l, err := netlink.LinkByName(hostLink)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(l)
}
