// Package testport hands tests loopback TCP ports (freeport's) to pass
// to a server they start (a NATS node, a daemon), failing the test when
// there is none.
package testport

import (
	"testing"

	"github.com/forkbox/forkbox/internal/freeport"
)

// Free is freeport.Loopback; it fails t when no port is found.
func Free(t testing.TB) int {
	t.Helper()
	p, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Addr is freeport.LoopbackAddr; it fails t when no port is found.
func Addr(t testing.TB) string {
	t.Helper()
	a, err := freeport.LoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}
