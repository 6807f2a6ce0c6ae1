package e2e

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// portBody fetches path from port of session id through the daemon's REST
// port path; ok is false unless it answered 200.
func portBody(t *testing.T, id, port, path string) (string, bool) {
	t.Helper()
	resp, err := env.c.PortGet(ctxFor(t, time.Minute), id, mustPort(t, port), path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode == http.StatusOK
}

// TestSandboxPortsGVisor proves the port path works in the gVisor tier
// (the agent dials the Sentry's loopback), and that a memory snapshot
// taken while a tunnel is open succeeds (the agent's prepare closes the
// tunnel) and gives forks whose servers answer on their own ports.
func TestSandboxPortsGVisor(t *testing.T) {
	needGVisor(t)
	s := gvisorSession(t)
	sh(t, s.ID, "mkdir -p /tmp/www && echo gvisor port > /tmp/www/hello.txt")
	background(t, s.ID, "cd /tmp/www && exec python3 -m http.server -b 127.0.0.1 8000")
	waitFor(t, func() bool { _, ok := portBody(t, s.ID, "8000", "/hello.txt"); return ok })
	if body, _ := portBody(t, s.ID, "8000", "/hello.txt"); body != "gvisor port\n" {
		t.Fatalf("through the port: %q", body)
	}
	background(t, s.ID, `python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 8002)); s.listen(4)
while True:
    c, _ = s.accept()
    while c.recv(65536):
        pass
'`)
	var conn interface{ Close() error }
	waitFor(t, func() bool {
		c, err := env.c.DialPort(ctxFor(t, time.Minute), s.ID, 8002)
		if err != nil {
			return false
		}
		conn = c
		return true
	})
	defer conn.Close()
	sn := memorySnapshot(t, s.ID)
	for _, f := range forkAll(t, sn.ID, 2) {
		waitFor(t, func() bool {
			body, ok := portBody(t, f.ID, "8000", "/hello.txt")
			return ok && strings.HasPrefix(body, "gvisor")
		})
	}
	if body, ok := portBody(t, s.ID, "8000", "/hello.txt"); !ok || body != "gvisor port\n" {
		t.Errorf("the source after the snapshot: %q %v", body, ok)
	}
}

// mustPort is port as a number.
func mustPort(t *testing.T, port string) int {
	t.Helper()
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
