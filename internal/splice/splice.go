// Package splice copies the bytes of two connections into each other, for
// the tunnels to sandbox ports: the agent's (a connection from the host to
// a port on the sandbox's loopback), the daemon's (a client's connection
// to the agent's) and the CLI's port-forward (a local connection to the
// daemon's).
package splice

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
)

// BufferBytes is the size of each direction's copy buffer: what one
// spliced pair holds in memory is two of them.
const BufferBytes = 32 << 10

// Conns copies a's bytes (the first of them read ahead into ahead, which
// may be nil) to b and b's to a, until both directions are done. The end
// of one direction is passed on as a shut sending half (CloseWrite) where
// the receiving connection has one, so protocols that half-close work; an
// error in either direction, or a connection that cannot half-close,
// closes both. Both connections are closed when it returns.
func Conns(a net.Conn, ahead *bufio.Reader, b net.Conn) {
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			a.Close()
			b.Close()
		})
	}
	defer closeBoth()
	var wg sync.WaitGroup
	pass := func(dst net.Conn, src io.Reader) {
		defer wg.Done()
		buf := make([]byte, BufferBytes)
		// (The wrapper keeps io.CopyBuffer to this buffer: no ReadFrom.)
		if _, err := io.CopyBuffer(struct{ io.Writer }{dst}, src, buf); err != nil {
			closeBoth()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
			closeBoth()
		}
	}
	var from io.Reader = a
	if ahead != nil && ahead.Buffered() > 0 {
		from = io.MultiReader(io.LimitReader(ahead, int64(ahead.Buffered())), a)
	}
	wg.Add(2)
	go pass(b, from)
	go pass(a, b)
	wg.Wait()
}

// Upgrading reports whether h asks to upgrade its connection to protocol
// (RFC 9110 §7.8: "Connection: upgrade", the token in any case, among
// others, and Upgrade naming protocol), the start of every tunnel here.
func Upgrading(h http.Header, protocol string) bool {
	if !strings.EqualFold(h.Get("Upgrade"), protocol) {
		return false
	}
	for _, v := range h.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

// Switch answers an upgrade to protocol on a hijacked connection's rw:
// the 101 status line and headers (RFC 9110 §15.2.2), flushed, so that
// the bytes after it are the tunnel's.
func Switch(rw *bufio.ReadWriter, protocol string) error {
	if _, err := rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + protocol + "\r\n\r\n"); err != nil {
		return err
	}
	return rw.Flush()
}
