package netpolicy

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func mustPolicy(t *testing.T, entries ...string) *Policy {
	t.Helper()
	rules, err := ParseAllow("network.allow", entries)
	if err != nil {
		t.Fatal(err)
	}
	return &Policy{Allow: rules}
}

func TestParseRule(t *testing.T) {
	for in, want := range map[string]string{
		"API.Example.com:443":        "api.example.com:443",
		"api.example.com.:443":       "api.example.com:443",
		"*.pypi.org:443":             "*.pypi.org:443",
		"203.0.113.0/24":             "203.0.113.0/24",
		"203.0.113.9/24:8443":        "203.0.113.0/24:8443",
		"198.51.100.7:80":            "198.51.100.7/32:80",
		"[2001:db8::1]:443":          "2001:db8::1/128:443",
		"2001:db8::/32":              "2001:db8::/32",
		" files.example.org:21 ":     "files.example.org:21",
		"under_score.example.com:80": "under_score.example.com:80",
	} {
		r, err := ParseRule(in)
		if err != nil {
			t.Errorf("ParseRule(%q): %v", in, err)
			continue
		}
		if r.String() != want {
			t.Errorf("ParseRule(%q) = %s, want %s", in, r, want)
		}
	}
	for _, in := range []string{"", "example.com", "example.com:0", "example.com:65536", "example.com:http",
		"*.com:443", "*:443", "ex ample.com:443", "-bad.com:443", "bücher.de:443", "10.0.0.0/33", "1.2.3.0/24:x",
		"a..b:443", strings.Repeat("a", 64) + ".com:443", "::1:80", "2001:db8::1:443", "x.com:+80", "x.com:080"} {
		if r, err := ParseRule(in); err == nil {
			t.Errorf("ParseRule(%q) = %v, want an error", in, r)
		}
	}
	_, err := ParseAllow("network.allow", []string{"ok.com:443", "bad"})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "network.allow[1]") {
		t.Errorf("ParseAllow error = %v, want one naming network.allow[1]", err)
	}
}

func TestPolicyMatching(t *testing.T) {
	p := mustPolicy(t, "api.example.com:443", "*.pypi.org:443", "198.51.100.0/24", "203.0.113.5/32:8080")
	for _, tc := range []struct {
		name string
		port uint16
		want bool
	}{
		{"api.example.com", 443, true},
		{"API.EXAMPLE.COM.", 443, true},
		{"api.example.com", 80, false},
		{"example.com", 443, false},
		{"evil-api.example.com", 443, false},
		{"api.example.com.evil.net", 443, false},
		{"files.pypi.org", 443, true},
		{"a.b.pypi.org", 443, true},
		{"pypi.org", 443, false},
		{"notpypi.org", 443, false},
		{"198.51.100.1", 443, false}, // an IP literal needs an address rule
	} {
		if got := p.AllowsName(tc.name, tc.port); got != tc.want {
			t.Errorf("AllowsName(%s, %d) = %v, want %v", tc.name, tc.port, got, tc.want)
		}
	}
	if !p.Resolvable("api.example.com") || !p.Resolvable("x.pypi.org") || p.Resolvable("example.com") {
		t.Error("Resolvable does not follow the name rules")
	}
	for _, tc := range []struct {
		addr string
		port uint16
		want bool
	}{
		{"198.51.100.77", 1234, true},
		{"::ffff:198.51.100.77", 22, true},
		{"198.51.101.1", 443, false},
		{"203.0.113.5", 8080, true},
		{"203.0.113.5", 80, false},
	} {
		if got := p.AllowsAddr(netip.MustParseAddr(tc.addr), tc.port); got != tc.want {
			t.Errorf("AllowsAddr(%s, %d) = %v, want %v", tc.addr, tc.port, got, tc.want)
		}
	}
}

func TestBlocklist(t *testing.T) {
	b := NewBlocklist(map[netip.Prefix]string{netip.MustParsePrefix("192.0.2.10/32"): "the host's own address"})
	for _, blocked := range []string{"10.1.2.3", "172.20.0.1", "192.168.1.1", "127.0.0.1", "169.254.169.254",
		"100.100.100.200", "0.0.0.0", "224.0.0.251", "255.255.255.255", "::1", "fe80::1", "fd00:ec2::254",
		"::ffff:169.254.169.254", "::ffff:127.0.0.1", "64:ff9b::a9fe:a9fe", "192.0.2.10", "::"} {
		if b.Blocked(netip.MustParseAddr(blocked), 443) == "" {
			t.Errorf("%s is not blocked", blocked)
		}
	}
	for _, open := range []string{"8.8.8.8", "2606:4700::1111", "1.1.1.1"} {
		if why := b.Blocked(netip.MustParseAddr(open), 443); why != "" {
			t.Errorf("%s is blocked: %s", open, why)
		}
	}
	for _, port := range []uint16{25, 465, 587, 2525} {
		if b.Blocked(netip.MustParseAddr("8.8.8.8"), port) == "" {
			t.Errorf("mail port %d is not blocked", port)
		}
	}
	if b.Blocked(netip.Addr{}, 443) == "" {
		t.Error("the zero address is not blocked")
	}
}

func TestBlocklistHostNetworks(t *testing.T) {
	b := NewBlocklist(nil).WithHostNetworks()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ipn := a.(*net.IPNet)
		ip, _ := netip.AddrFromSlice(ipn.IP)
		ip = ip.Unmap()
		if b.Blocked(ip, 443) == "" {
			t.Errorf("the host's own %s is not blocked", ip)
		}
		// A neighbour on the same network (the host's LAN and gateway).
		if ones, bits := ipn.Mask.Size(); ones < bits {
			if n := ip.Next(); netip.PrefixFrom(ip, ones).Masked().Contains(n) && b.Blocked(n, 443) == "" {
				t.Errorf("%s, on the host's network %s/%d, is not blocked", n, ip, ones)
			}
		}
	}
	for _, v6 := range []string{"::ffff:0:7f00:1", "::127.0.0.1", "2002:7f00:1::1", "2001:0:4136:e378::1"} {
		if b.Blocked(netip.MustParseAddr(v6), 443) == "" {
			t.Errorf("%s (IPv4 through IPv6) is not blocked", v6)
		}
	}
}

// TestRuleCovers proves the ceiling check: a rule covers exactly the
// destinations it allows itself.
func TestRuleCovers(t *testing.T) {
	for _, c := range []struct {
		ceiling, rule string
		want          bool
	}{
		{"api.example.com:443", "api.example.com:443", true},
		{"api.example.com:443", "API.example.com.:443", true},
		{"api.example.com:443", "api.example.com:80", false},
		{"api.example.com:443", "*.api.example.com:443", false},
		{"*.example.com:443", "api.example.com:443", true},
		{"*.example.com:443", "a.b.example.com:443", true},
		{"*.example.com:443", "*.b.example.com:443", true},
		{"*.example.com:443", "*.example.com:443", true},
		{"*.example.com:443", "example.com:443", false},
		{"*.example.com:443", "evilexample.com:443", false},
		{"*.example.com:443", "203.0.113.7:443", false},
		{"203.0.113.0/24", "203.0.113.7:443", true},
		{"203.0.113.0/24", "203.0.113.0/25:22", true},
		{"203.0.113.0/24", "203.0.112.0/23", false},
		{"203.0.113.0/24:443", "203.0.113.7:443", true},
		{"203.0.113.0/24:443", "203.0.113.7:80", false},
		{"203.0.113.0/24:443", "203.0.113.0/24", false},
		{"203.0.113.0/24", "api.example.com:443", false},
		{"::/0", "203.0.113.7:443", false},
	} {
		r, err := ParseRule(c.ceiling)
		if err != nil {
			t.Fatal(err)
		}
		o, err := ParseRule(c.rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Covers(o); got != c.want {
			t.Errorf("%s covers %s = %v, want %v", c.ceiling, c.rule, got, c.want)
		}
	}
}
