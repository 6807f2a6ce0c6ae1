package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/splice"
)

// portDialTimeout bounds the agent's connect to a port inside the
// sandbox. Loopback answers at once (a listener accepts, or the kernel
// refuses): the bound only matters for a listener whose backlog is full.
const portDialTimeout = 5 * time.Second

// handlePort serves GET /port/{port} with "Connection: Upgrade" and
// "Upgrade: forkbox-tcp" (wire.PortUpgrade): the agent connects to
// 127.0.0.1:PORT inside the sandbox's own network namespace (then
// [::1]:PORT), answers 101 and copies bytes both ways until either side
// is done. The connection is made from in here, so the host never opens a
// route into the sandbox, and only loopback is dialled: a sandbox cannot
// use this to reach the host or another sandbox.
//
// Answers: 400 for a port outside 1-65535 or a request without the
// upgrade; 502 at once when nothing listens on the port ("nothing listens
// on port N in the sandbox"), with wire.PortErrorHeader naming why.
func (a *Agent) handlePort(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		http.Error(w, fmt.Sprintf("port %q: must be a number from 1 to 65535", r.PathValue("port")), http.StatusBadRequest)
		return
	}
	if !splice.Upgrading(r.Header, wire.PortUpgrade) {
		http.Error(w, "a port tunnel needs Connection: Upgrade and Upgrade: "+wire.PortUpgrade, http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), portDialTimeout)
	target, err := dialLoopback(ctx, port)
	cancel()
	if err != nil {
		w.Header().Set(wire.PortErrorHeader, wire.PortNotListening)
		http.Error(w, fmt.Sprintf("nothing listens on port %d in the sandbox", port), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		target.Close()
		http.Error(w, "a port tunnel needs HTTP/1.1", http.StatusHTTPVersionNotSupported)
		return
	}
	client, rw, err := hj.Hijack()
	if err != nil {
		target.Close()
		return
	}
	if err := splice.Switch(rw, wire.PortUpgrade); err != nil {
		client.Close()
		target.Close()
		return
	}
	a.trackTunnel(client, true)
	defer a.trackTunnel(client, false)
	splice.Conns(client, rw.Reader, target)
}

// trackTunnel adds (open) or removes a tunnel's connection from the host.
func (a *Agent) trackTunnel(c net.Conn, open bool) {
	a.tunnelMu.Lock()
	defer a.tunnelMu.Unlock()
	if !open {
		delete(a.tunnels, c)
		return
	}
	if a.tunnels == nil {
		a.tunnels = map[net.Conn]struct{}{}
	}
	a.tunnels[c] = struct{}{}
}

// closeTunnels closes every open tunnel's connection from the host (each
// tunnel then closes its connection in the sandbox): a memory checkpoint
// cannot keep a connection to the host, and a restored clone must not
// share one.
func (a *Agent) closeTunnels() {
	a.tunnelMu.Lock()
	defer a.tunnelMu.Unlock()
	for c := range a.tunnels {
		c.Close()
	}
}

// dialLoopback connects to port on the sandbox's loopback: 127.0.0.1
// first, then [::1] (a server bound to the IPv6 loopback only).
func dialLoopback(ctx context.Context, port int) (net.Conn, error) {
	var d net.Dialer
	p := strconv.Itoa(port)
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", p))
	if err == nil {
		return c, nil
	}
	c, err6 := d.DialContext(ctx, "tcp", net.JoinHostPort("::1", p))
	if err6 == nil {
		return c, nil
	}
	return nil, errors.Join(err, err6)
}
