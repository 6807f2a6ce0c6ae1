package guest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/node"
)

// portHandshake bounds the upgrade exchange of DialPort when ctx has no
// earlier deadline (the agent dials loopback, which answers at once).
const portHandshake = 10 * time.Second

// DialPort returns a connection to TCP port (1-65535) on the sandbox's own
// loopback, made by the agent inside the sandbox (GET /port/{port}, which
// upgrades to wire.PortUpgrade): the host opens no route into the sandbox.
// ctx bounds the handshake only; the connection lives until closed. The
// returned net.Conn is a Unix connection to the agent (CloseWrite passes
// a half-close on to the port).
//
// Errors are *Error values: a port outside 1-65535 is ErrInvalidArgument
// (field "port", Refused); nothing listening there is ErrUnavailable
// typed node.ProblemPortNotListening (Refused: the agent answered at
// once); another refusal of the agent node.ProblemAgentFailed (Failed);
// no answer ErrUnavailable (Unreachable).
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, &Error{Kind: Refused, Err: errdefs.InvalidField("port", "must be from 1 to 65535, not %d", port)}
	}
	conn, err := dial(ctx, c.socket)
	if err != nil {
		return nil, &Error{Kind: Unreachable, Err: fmt.Errorf("%s: %w", err.Error(), errdefs.ErrUnavailable), Cause: err}
	}
	deadline := time.Now().Add(portHandshake)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	br, resp, err := portHandshakeOn(conn, port)
	stopped := stop()
	if err == nil && !stopped {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &Error{Kind: Unreachable, Err: fmt.Errorf("agent: port %d: %s: %w", port, err.Error(), errdefs.ErrUnavailable), Cause: err}
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		text := strings.TrimSpace(string(msg))
		switch {
		case resp.Header.Get(wire.PortErrorHeader) == wire.PortNotListening:
			return nil, &Error{Kind: Refused, Err: errdefs.Typed(errdefs.ErrUnavailable, node.ProblemPortNotListening, "%s", text)}
		case resp.StatusCode == http.StatusBadRequest:
			return nil, &Error{Kind: Refused, Err: errdefs.InvalidField("port", "%s", text)}
		}
		return nil, &Error{Kind: Failed, Err: AgentFailed(fmt.Sprintf("port %d: HTTP %d: %s", port, resp.StatusCode, text))}
	}
	_ = conn.SetDeadline(time.Time{})
	if br.Buffered() == 0 {
		return conn, nil
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}

// portHandshakeOn sends the upgrade request for port on conn and reads the
// agent's answer.
func portHandshakeOn(conn net.Conn, port int) (*bufio.Reader, *http.Response, error) {
	req := fmt.Sprintf("GET /port/%d HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", port, wire.PortUpgrade)
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, nil, err
	}
	br := bufio.NewReaderSize(conn, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, err
	}
	return br, resp, nil
}

// bufferedConn is a connection whose first bytes were read ahead into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

// Read reads what r holds first, then from the connection.
func (b *bufferedConn) Read(p []byte) (int, error) {
	if b.r != nil {
		if b.r.Buffered() > 0 {
			return b.r.Read(p)
		}
		b.r = nil
	}
	return b.Conn.Read(p)
}

// CloseWrite shuts the sending half of the connection to the agent.
func (b *bufferedConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
