package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

// testNetworks is where this package's test hosts live (internal/testnet):
// a documentation range the blocklist refuses except to tests.
var testNetworks = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}

// testBlocklist is the production blocklist with testNetworks opened.
func testBlocklist(t *testing.T) *Blocklist {
	t.Helper()
	b, err := NewBlocklist(nil).WithTestNetworks(testNetworks)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBlocklistSpecialPurpose walks IANA's IPv4 and IPv6 Special-Purpose
// Address Registries (and the IPv6 Address Space registry) entry by
// entry, independently of the list in blocklist.go: every range that is
// not globally reachable is refused, at its first and last address, with
// a reason naming it; the globally reachable neighbours stay open.
func TestBlocklistSpecialPurpose(t *testing.T) {
	b := NewBlocklist(nil)
	refused := []struct{ first, last, in string }{
		{"0.0.0.0", "0.255.255.255", "0.0.0.0/8"},
		{"10.0.0.0", "10.255.255.255", "10.0.0.0/8"},
		{"100.64.0.0", "100.127.255.255", "100.64.0.0/10"},
		{"127.0.0.0", "127.255.255.255", "127.0.0.0/8"},
		{"169.254.0.0", "169.254.255.255", "169.254.0.0/16"},
		{"172.16.0.0", "172.31.255.255", "172.16.0.0/12"},
		{"192.0.0.0", "192.0.0.255", "192.0.0.0/24"}, // incl. 192.0.0.8 dummy, .170/.171 NAT64 discovery
		{"192.0.2.0", "192.0.2.255", "192.0.2.0/24"},
		{"192.88.99.0", "192.88.99.255", "192.88.99.0/24"}, // incl. 192.88.99.2 6a44 relay
		{"192.168.0.0", "192.168.255.255", "192.168.0.0/16"},
		{"198.18.0.0", "198.19.255.255", "198.18.0.0/15"},
		{"198.51.100.0", "198.51.100.255", "198.51.100.0/24"},
		{"203.0.113.0", "203.0.113.255", "203.0.113.0/24"},
		{"224.0.0.0", "239.255.255.255", "224.0.0.0/4"},
		{"240.0.0.0", "255.255.255.255", "240.0.0.0/4"},
		{"::", "::ffff:ffff", "::/96"},
		{"::1", "::1", "::1/128"},
		{"::ffff:0:0:0", "::ffff:0:ffff:ffff", "::ffff:0:0:0/96"},
		{"64:ff9b::", "64:ff9b::ffff:ffff", "64:ff9b::/96"},
		{"64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff", "64:ff9b:1::/48"},
		{"100::", "100::ffff:ffff:ffff:ffff", "100::/64"},
		{"100:0:0:1::", "100:0:0:1:ffff:ffff:ffff:ffff", "100:0:0:1::/64"},
		{"2001::", "2001:0:ffff:ffff:ffff:ffff:ffff:ffff", "2001::/32"},
		{"2001:1::1", "2001:1::3", "2001::/23"},
		{"2001:2::", "2001:2:0:ffff:ffff:ffff:ffff:ffff", "2001:2::/48"},
		{"2001:10::", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", "2001::/23"},
		{"2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db8::/32"},
		{"2002::", "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2002::/16"},
		{"3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", "3fff::/20"},
		{"5f00::", "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "5f00::/16"},
		{"fc00::", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fc00::/7"},
		{"fe80::", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fe80::/10"},
		{"fec0::", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fec0::/10"},
		{"ff00::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ff00::/8"},
		// Reserved by the IETF (IPv6 Address Space registry).
		{"200::", "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2000::/3"},
		{"4000::", "5eff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2000::/3"},
		{"5f01::", "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2000::/3"},
		{"fe00::", "fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2000::/3"},
	}
	for _, r := range refused {
		for _, a := range []string{r.first, r.last} {
			why := b.Blocked(netip.MustParseAddr(a), 443)
			if !strings.Contains(why, r.in) {
				t.Errorf("%s: %q, want a refusal naming %s", a, why, r.in)
			}
		}
	}
	// IPv4-mapped forms are judged as the IPv4 address they carry.
	for _, a := range []string{"::ffff:10.0.0.1", "::ffff:192.0.2.1", "::ffff:203.0.113.9"} {
		if b.Blocked(netip.MustParseAddr(a), 443) == "" {
			t.Errorf("%s is not blocked", a)
		}
	}
	open := []string{
		"8.8.8.8", "1.1.1.1", "192.0.1.255", "192.0.3.0", "192.88.98.255", "192.88.100.0",
		"198.17.255.255", "198.20.0.0", "198.51.99.255", "198.51.101.0", "203.0.112.255", "203.0.114.0",
		"100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0", "223.255.255.255",
		"192.31.196.1", "192.52.193.1", "192.175.48.1", // AS112, AMT: globally reachable
		"2001:200::1", "2001:db7:ffff::1", "2001:db9::", "2001:4860:4860::8888", "2606:4700::1111",
		"3ffe:ffff::1", "3fff:1000::", "2620:4f:8000::1", "2003::1",
	}
	for _, a := range open {
		if why := b.Blocked(netip.MustParseAddr(a), 443); why != "" {
			t.Errorf("%s (globally reachable) is blocked: %s", a, why)
		}
	}
}

// TestBlocklistTestNetworks: tests can open a documentation range for
// their own hosts, and nothing else; the other refusals still apply there.
func TestBlocklistTestNetworks(t *testing.T) {
	b := testBlocklist(t)
	if why := b.Blocked(netip.MustParseAddr("198.51.100.7"), 443); why != "" {
		t.Errorf("a test host is blocked: %s", why)
	}
	if b.Blocked(netip.MustParseAddr("198.51.100.7"), 25) == "" {
		t.Error("mail port open on a test network")
	}
	for _, a := range []string{"203.0.113.1", "192.0.2.1", "2001:db8::1", "10.0.0.1"} {
		if b.Blocked(netip.MustParseAddr(a), 443) == "" {
			t.Errorf("%s is open, though no test network holds it", a)
		}
	}
	host, err := NewBlocklist(map[netip.Prefix]string{netip.MustParsePrefix("198.51.100.7/32"): "the host's own"}).
		WithTestNetworks(testNetworks)
	if err != nil {
		t.Fatal(err)
	}
	if host.Blocked(netip.MustParseAddr("198.51.100.7"), 443) == "" {
		t.Error("a test network opened an extra (host) range")
	}
	for _, bad := range []string{"10.0.0.0/8", "198.51.0.0/16", "0.0.0.0/0", "8.8.8.0/24", "fec0::/10", "::/0"} {
		if _, err := NewBlocklist(nil).WithTestNetworks([]netip.Prefix{netip.MustParsePrefix(bad)}); err == nil {
			t.Errorf("WithTestNetworks(%s) accepted", bad)
		}
	}
	for _, ok := range []string{"203.0.113.0/25", "2001:db8:1::/48", "3fff::/20", "192.0.2.9/32"} {
		if _, err := NewBlocklist(nil).WithTestNetworks([]netip.Prefix{netip.MustParsePrefix(ok)}); err != nil {
			t.Errorf("WithTestNetworks(%s): %v", ok, err)
		}
	}
}
