// Package testport hands tests loopback TCP ports to pass to a server
// they start (a NATS node, a daemon) that nothing else can take first.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// handedOut holds the ports Free returned in this test process.
var handedOut struct {
	mu    sync.Mutex
	ports map[int]bool
}

// Free returns a loopback TCP port that is free now, was not
// returned before in this process, and lies below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range). A port taken with
// Listen(":0") and closed comes from that range, so an outgoing
// connection of any process (one NATS node dialling another) can take
// it before the daemon the test passes it to binds it; below the range
// only a listener can. It fails t when no such port is found.
func Free(t testing.TB) int {
	t.Helper()
	lo := 32768 // the kernel's default start of the range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var a, z int
		if n, _ := fmt.Sscan(string(b), &a, &z); n == 2 && a > 2048 {
			lo = a
		}
	}
	base := max(1024, lo/2)
	handedOut.mu.Lock()
	defer handedOut.mu.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	for range 1000 {
		p := base + rand.IntN(lo-base)
		if handedOut.ports[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		handedOut.ports[p] = true
		return p
	}
	t.Fatalf("no free loopback port in %d-%d", base, lo-1)
	return 0
}

// Addr is 127.0.0.1:Free(t).
func Addr(t testing.TB) string { return fmt.Sprintf("127.0.0.1:%d", Free(t)) }
