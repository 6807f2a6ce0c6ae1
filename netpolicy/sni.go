package netpolicy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"
)

// ServeTransparentTLS serves TLS that the sandbox sent to port 443 of any
// address (redirected to l by nftables): the server name of the
// ClientHello (SNI) names the destination, which gets the handshake
// unchanged. TLS is never terminated; a hello without a server name is
// refused.
func (e *Egress) ServeTransparentTLS(l net.Listener) {
	l = e.admitting(l, "tls")
	e.start(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go e.serveTLSConn(c)
		}
	}, func() { l.Close() })
}

func (e *Egress) serveTLSConn(c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	name, hello, err := readServerName(c)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil || name == "" {
		e.cfg.Sink(Event{Time: time.Now(), Kind: "tls", Port: 443, Decision: DecisionDeny,
			Reason: "no TLS server name (SNI) in the ClientHello"})
		return
	}
	if i := e.interceptor(name); i != nil {
		if e.precheck("tls", name, 443) == nil {
			e.intercept(i, c, hello, name)
		}
		return
	}
	up, err := e.dial(context.Background(), "tls", name, 443)
	if err != nil {
		return // recorded by dial; the sandbox sees the connection close
	}
	defer up.Close()
	if _, err := up.Write(hello); err != nil {
		return
	}
	splice(c, c, up)
}

// errHelloRead stops the handshake once the ClientHello is read.
var errHelloRead = errors.New("client hello read")

// readServerName reads the TLS ClientHello from c and returns its server
// name and every byte read, to be replayed to the destination. crypto/tls
// parses the hello (over a connection that records what is read and
// refuses writes), so no hand-written parser sees hostile input.
func readServerName(c net.Conn) (string, []byte, error) {
	var buf bytes.Buffer
	var name string
	conf := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name = h.ServerName
		return nil, errHelloRead
	}}
	err := tls.Server(recordingConn{Conn: c, r: io.TeeReader(io.LimitReader(c, 64<<10), &buf)}, conf).Handshake()
	if name == "" {
		if err == nil {
			err = errors.New("no server name")
		}
		return "", nil, err
	}
	return name, buf.Bytes(), nil
}

// recordingConn reads through r and refuses writes (the handshake must not
// answer the client).
type recordingConn struct {
	net.Conn
	r io.Reader
}

func (c recordingConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c recordingConn) Write(b []byte) (int, error) { return 0, io.ErrClosedPipe }
