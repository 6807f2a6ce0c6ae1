package testnet

import (
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestStartFailsCleanly: a Start that fails midway (here: the address's
// host route is taken by another test host) returns its error instead of
// panicking, and leaves no link of its own behind.
func TestStartFailsCleanly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network namespaces and links")
	}
	const addr = "198.51.100.251"
	first, err := Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	before, _ := netlink.LinkList()
	second, err := Start(addr)
	if err == nil {
		second.Close()
		t.Fatalf("a second host at %s started", addr)
	}
	after, _ := netlink.LinkList()
	var left []string
	for _, l := range after {
		if n := l.Attrs().Name; strings.HasPrefix(n, "fbt") && n != first.link {
			left = append(left, n)
		}
	}
	if len(after) != len(before) {
		t.Errorf("the failed Start left links: %v", left)
	}
}
