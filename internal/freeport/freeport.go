// Package freeport finds loopback TCP ports to hand to a server that is
// started later (a NATS node whose peers must know its port before it
// listens, a daemon started as a child process) where nothing else can
// take them first.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
)

// handedOut holds the ports Loopback returned in this process.
var handedOut struct {
	mu    sync.Mutex
	ports map[int]bool
}

// Loopback returns a TCP port of 127.0.0.1 that is free now, was not
// returned before in this process, and lies below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range). A port taken with
// Listen(":0") and closed comes from that range, so an outgoing
// connection of any process (one NATS node dialling another) can take
// it before the server it was meant for binds it; below the range only
// a listener can. An error when 1000 tries found none.
func Loopback() (int, error) {
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
		return p, nil
	}
	return 0, fmt.Errorf("no free loopback port in %d-%d", base, lo-1)
}

// LoopbackN returns n ports as Loopback does, all different.
func LoopbackN(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		p, err := Loopback()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	return ports, nil
}

// LoopbackAddr is "127.0.0.1:" and Loopback's port.
func LoopbackAddr() (string, error) {
	p, err := Loopback()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", p), nil
}
