package sandbox

import (
	"context"
	"net"
	"sync"
)

// DialPort returns a connection to TCP port (1-65535) on running session
// id's own loopback, made by its agent inside the sandbox (guest
// Client.DialPort): no route from the host into the sandbox is opened.
// The connection holds the session as a call does (m.use: a session its
// auto-pause paused is resumed first, and it does not idle while the
// connection is open) until it is closed. Errors: ErrNotFound for an
// unknown id or another tenant's session; ErrTerminated; ErrConflict for
// a session paused on request or still being created; a field error on
// "port" for a port out of range; ErrUnavailable typed
// node.ProblemPortNotListening when nothing listens there.
func (cs *Commands) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	sb, release, err := cs.m.use(ctx, id)
	if err != nil {
		return nil, err
	}
	conn, err := sb.agent.DialPort(ctx, port)
	if err != nil {
		release()
		return nil, cs.hostCheck(ctx, id, err)
	}
	return &heldConn{Conn: conn, release: release}, nil
}

// heldConn is a port connection that ends its session hold when closed.
type heldConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close closes the connection and releases the hold (once).
func (c *heldConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite shuts the sending half: the server in the sandbox reads the
// end of its input.
func (c *heldConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
