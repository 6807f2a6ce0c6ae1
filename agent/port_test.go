package agent

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/guest/wire"
)

// openTunnel sends the port upgrade for port to the agent at addr and
// returns the connection and the agent's answer.
func openTunnel(t *testing.T, addr, port string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "GET /port/%s HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", port, wire.PortUpgrade)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, br, resp
}

// TestPortTunnel proves the agent's port tunnel connects to a loopback
// listener and carries bytes both ways, passes a half-close on (the
// server sees the end of the request and still answers), refuses a port
// nothing listens on with a 502 naming it, and refuses bad ports and
// requests without the upgrade with a 400.
func TestPortTunnel(t *testing.T) {
	a := New(wire.Config{}, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	// A server that reads everything to the end, then answers with its
	// length and closes: it only answers once the tunnel passed the
	// client's half-close on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				fmt.Fprintf(c, "got %d bytes: %.5s", len(b), b)
			}()
		}
	}()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)

	c, br, resp := openTunnel(t, addr, port)
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != wire.PortUpgrade {
		t.Fatalf("tunnel: %d %v", resp.StatusCode, resp.Header)
	}
	payload := strings.Repeat("hello", 100000) // larger than the copy buffers
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("got %d bytes: hello", len(payload)); string(got) != want {
		t.Fatalf("through the tunnel: %q, want %q", got, want)
	}

	// Nothing listens: a 502 at once, saying so.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := strconv.Itoa(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	_, _, resp = openTunnel(t, addr, closed)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(wire.PortErrorHeader) != wire.PortNotListening ||
		!strings.Contains(string(body), "nothing listens on port "+closed) {
		t.Fatalf("closed port: %d %v %q", resp.StatusCode, resp.Header, body)
	}

	for _, bad := range []string{"0", "65536", "70000", "-1", "abc"} {
		_, _, resp := openTunnel(t, addr, bad)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("port %s: %d, want 400", bad, resp.StatusCode)
		}
	}
	plain, err := http.Get(srv.URL + "/port/" + port)
	if err != nil {
		t.Fatal(err)
	}
	plain.Body.Close()
	if plain.StatusCode != http.StatusBadRequest {
		t.Errorf("without the upgrade: %d, want 400", plain.StatusCode)
	}
}
