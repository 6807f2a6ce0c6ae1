package freeport

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// TestLoopbackBelowEphemeral checks that the ports are all different,
// bindable, and below the start of the kernel's ephemeral range.
func TestLoopbackBelowEphemeral(t *testing.T) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &lo)
	}
	ports, err := LoopbackN(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] || p < 1024 || p >= lo {
			t.Fatalf("port %d: repeated or outside 1024-%d (%v)", p, lo-1, ports)
		}
		seen[p] = true
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	if err != nil {
		t.Fatalf("the port handed out cannot be bound: %v", err)
	}
	l.Close()
}
