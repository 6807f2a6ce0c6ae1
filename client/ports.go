package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/internal/splice"
)

// portUpgrade is the Upgrade token of the daemon's raw TCP tunnel to a
// sandbox port (GET /v1/sessions/{id}/ports/{port}).
const portUpgrade = "forkbox-tcp"

// DialPort opens a TCP connection to port (1-65535) inside session id,
// tunnelled through the daemon (GET /v1/sessions/{id}/ports/{port} with
// Upgrade: forkbox-tcp); the connection inside the sandbox is made by its
// agent. Any TCP protocol passes; CloseWrite on the returned connection
// passes a half-close on. ctx bounds the handshake only. Errors are
// *Error values with the daemon's problem (400 for a bad port, 404 for an
// unknown session, 409 for a paused one, 502 port-not-listening when
// nothing listens there), or the dial's own error.
func (c *Client) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	u, err := url.Parse(c.baseURL)
	if err != nil {
		return nil, err
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr = net.JoinHostPort(u.Hostname(), "443")
		} else {
			addr = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}})
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, err
		}
		conn = tc
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	br, resp, err := c.portHandshake(conn, u, id, port)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, decodeError(resp)
	}
	_ = conn.SetDeadline(time.Time{})
	return &readAheadConn{Conn: conn, r: br}, nil
}

// portHandshake sends the tunnel request on conn and reads the answer.
func (c *Client) portHandshake(conn net.Conn, u *url.URL, id string, port int) (*bufio.Reader, *http.Response, error) {
	path := u.Path + "/v1/sessions/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port)
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n",
		path, u.Host, c.apiKey, portUpgrade)
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, err
	}
	return br, resp, nil
}

// readAheadConn is a connection whose first bytes may sit in r.
type readAheadConn struct {
	net.Conn
	r *bufio.Reader
}

// Read reads through r (which holds what was read ahead).
func (c *readAheadConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite shuts the sending half, where the connection has one.
func (c *readAheadConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("the connection cannot half-close")
}

// PortForward accepts connections on l until ctx ends (then it closes l
// and returns nil) and tunnels each to port inside session id (DialPort),
// copying both ways until either side is done. A connection whose tunnel
// fails is closed and reported to onError (which may be nil); the
// listener keeps accepting. Before it accepts anything it checks that the
// session exists and is the caller's (its error then).
func (c *Client) PortForward(ctx context.Context, id string, l net.Listener, port int, onError func(error)) error {
	if _, err := c.GetSession(ctx, id); err != nil {
		l.Close()
		return err
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		local, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go func() {
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			remote, err := c.DialPort(dctx, id, port)
			cancel()
			if err != nil {
				local.Close()
				if onError != nil {
					onError(err)
				}
				return
			}
			splice.Conns(local, nil, remote)
		}()
	}
}

// PortGet sends GET path (with its query) to the server on port inside
// session id, through the daemon (GET /v1/sessions/{id}/ports/{port}/...,
// with the client's key), and returns the answer as it comes: the
// server's, or the daemon's problem (application/problem+json) when the
// request did not reach it. The caller closes the body.
func (c *Client) PortGet(ctx context.Context, id string, port int, path string) (*http.Response, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		c.baseURL+"/v1/sessions/"+id+"/ports/"+strconv.Itoa(port)+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	return c.http.Do(req)
}
