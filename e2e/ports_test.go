package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/forkbox/forkbox/client"
)

// e2eDomain is the --domain of the package's daemon: sandbox ports answer
// at PORT-ID.e2eDomain (the tests send that Host to the daemon's address).
const e2eDomain = "sbx.forkbox.test"

// portServers is a Python program (standard library only) run in the
// sandbox: on 127.0.0.1:8001 an HTTP server with /stream (one line, then
// a second only once /tmp/go exists: it can only be read in one piece if
// the proxy passes the first on before the body ends) and /ws (a minimal
// RFC 6455 WebSocket echo), and on 127.0.0.1:8002 a raw TCP server that
// answers "echo:" and everything it read once its input ended.
const portServers = `
import base64, hashlib, os, socket, struct, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def recv_frame(f):
    h = f.read(2)
    if len(h) < 2:
        return None, None
    op, n = h[0] & 0x0f, h[1] & 0x7f
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", f.read(8))[0]
    mask = f.read(4) if h[1] & 0x80 else b"\0\0\0\0"
    data = bytearray(f.read(n))
    for i in range(n):
        data[i] ^= mask[i % 4]
    return op, bytes(data)

def send_frame(f, op, data):
    n = len(data)
    if n < 126:
        hdr = bytes([0x80 | op, n])
    elif n < 65536:
        hdr = bytes([0x80 | op, 126]) + struct.pack(">H", n)
    else:
        hdr = bytes([0x80 | op, 127]) + struct.pack(">Q", n)
    f.write(hdr + data)
    f.flush()

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"first\n")
            self.wfile.flush()
            while not os.path.exists("/tmp/go"):
                time.sleep(0.05)
            self.wfile.write(b"second\n")
            return
        if self.path == "/ws":
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            while True:
                op, data = recv_frame(self.rfile)
                if op is None:
                    return
                if op == 8:
                    send_frame(self.wfile, 8, data)
                    return
                if op == 9:
                    send_frame(self.wfile, 10, data)
                elif op in (1, 2):
                    send_frame(self.wfile, op, data)
        body = ("path=%s host=%s forwarded=%s key=%s" % (self.path, self.headers.get("Host"),
                self.headers.get("X-Forwarded-Host"), self.headers.get("X-Api-Key"))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

def tcp_echo():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 8002))
    s.listen(16)
    while True:
        c, _ = s.accept()
        def serve(c):
            data = b""
            while True:
                b = c.recv(65536)
                if not b:
                    break
                data += b
            c.sendall(b"echo:" + data)
            c.close()
        threading.Thread(target=serve, args=(c,), daemon=True).start()

threading.Thread(target=tcp_echo, daemon=True).start()
ThreadingHTTPServer(("127.0.0.1", 8001), H).serve_forever()
`

// portSandbox is an E2B create's answer, as the port tests read it.
type portSandbox struct {
	SandboxID          string  `json:"sandboxID"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// portCreate creates a sandbox (no network egress) through E2B's create
// with body, and kills it when the test ends.
func portCreate(t *testing.T, body string) portSandbox {
	t.Helper()
	status, b := e2bCall(t, "POST", "/v2/sandboxes", body)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, b)
	}
	var sb portSandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e2bCall(t, "DELETE", "/sandboxes/"+sb.SandboxID, "") })
	return sb
}

// portGet sends GET path to the daemon with headers (Host among them
// sets the request's host) and returns the status and body.
func portGet(t *testing.T, path string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxFor(t, time.Minute), "GET", env.d.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// startPortServers uploads and starts portServers and python's own
// http.server (on 127.0.0.1:8000, serving /tmp/www) in session id, and
// waits until both answer through the daemon.
func startPortServers(t *testing.T, sb portSandbox) {
	t.Helper()
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := env.c.Upload(ctx, sb.SandboxID, "/tmp/servers.py", strings.NewReader(portServers), -1, ""); err != nil {
		t.Fatal(err)
	}
	sh(t, sb.SandboxID, "mkdir -p /tmp/www && echo hello from the sandbox > /tmp/www/hello.txt && head -c 3000000 /dev/urandom > /tmp/www/big.bin")
	for _, cmd := range []string{"python3 /tmp/servers.py", "cd /tmp/www && python3 -m http.server -b 127.0.0.1 8000"} {
		if _, err := env.c.ExecBackground(ctx, sb.SandboxID, client.ExecRequest{Cmd: cmd}); err != nil {
			t.Fatal(err)
		}
	}
	for _, port := range []string{"8000", "8001"} {
		for {
			st, _ := portGet(t, "/", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": port,
				"E2b-Traffic-Access-Token": sb.TrafficAccessToken})
			if st == http.StatusOK {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("port %s never answered: %d", port, st)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestSandboxPorts proves a server in a sandbox without network egress is
// reachable through the daemon by E2B's headers, by PORT-ID.DOMAIN host
// name and by forkbox's REST path, with streamed bodies and a WebSocket
// echo passing; that access is private by default (no token 403, a wrong
// key 401, another tenant's key 404; the traffic token, the envd token
// and the tenant's key open it) and public on request; that bad ports are
// 400, a closed port a 502 saying so, a paused sandbox 409; and that
// forkbox's credentials do not reach the sandbox.
func TestSandboxPorts(t *testing.T) {
	need(t)
	sb := portCreate(t, `{"templateID":"base","timeout":300}`)
	if sb.Domain == nil || *sb.Domain != e2eDomain || sb.TrafficAccessToken == "" {
		t.Fatalf("create answered domain %v, traffic token %q", sb.Domain, sb.TrafficAccessToken)
	}
	startPortServers(t, sb)
	id, tok := sb.SandboxID, sb.TrafficAccessToken
	hdr := func(port string, extra ...string) map[string]string {
		h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": port}
		for i := 0; i+1 < len(extra); i += 2 {
			h[extra[i]] = extra[i+1]
		}
		return h
	}

	// By headers, with each credential.
	for _, cred := range [][]string{{"E2b-Traffic-Access-Token", tok}, {"X-Access-Token", sb.EnvdAccessToken},
		{"X-Api-Key", env.key}, {"Authorization", "Bearer " + env.key}} {
		st, body := portGet(t, "/hello.txt", hdr("8000", cred...))
		if st != http.StatusOK || body != "hello from the sandbox\n" {
			t.Errorf("with %s: %d %q", cred[0], st, body)
		}
	}
	// The credentials stay out of the sandbox; Host is the client's.
	st, body := portGet(t, "/echo", hdr("8001", "X-Api-Key", env.key))
	if st != http.StatusOK || strings.Contains(body, env.key) || !strings.Contains(body, "key=None") {
		t.Errorf("headers the server saw: %d %q", st, body)
	}

	// The path and query arrive as the client encoded them.
	if st, body := portGet(t, "/a%2Fb/c?q=1&r=%20", hdr("8001", "E2b-Traffic-Access-Token", tok)); st != http.StatusOK ||
		!strings.HasPrefix(body, "path=/a%2Fb/c?q=1&r=%20 ") {
		t.Errorf("path by headers: %d %q", st, body)
	}
	if st, _, rb := rawCall(t, env.key, "GET", "/v1/sessions/"+id+"/ports/8001/a%2Fb/c?q=1", nil); st != http.StatusOK ||
		!strings.HasPrefix(string(rb), "path=/a%2Fb/c?q=1 ") || strings.Contains(string(rb), env.key) {
		t.Errorf("path by REST: %d %q", st, rb)
	}

	// Private by default.
	_, otherKey, _ := newTenant(t, env.c, "ports", client.TenantPolicy{})
	for _, c := range []struct {
		extra []string
		want  int
	}{
		{nil, http.StatusForbidden},
		{[]string{"E2b-Traffic-Access-Token", "wrong"}, http.StatusForbidden},
		{[]string{"X-Access-Token", "wrong"}, http.StatusForbidden},
		{[]string{"X-Api-Key", "e2b_0000000000000000000000000000000000000000"}, http.StatusUnauthorized},
		{[]string{"X-Api-Key", otherKey}, http.StatusNotFound},
	} {
		if st, body := portGet(t, "/hello.txt", hdr("8000", c.extra...)); st != c.want || !strings.Contains(body, `"code":`) {
			t.Errorf("with %v: %d %s, want %d in E2B's JSON", c.extra, st, body, c.want)
		}
	}

	// By host name, as getHost(port) names it.
	host := "8000-" + id + "." + e2eDomain
	if st, body := portGet(t, "/hello.txt", map[string]string{"Host": host, "E2b-Traffic-Access-Token": tok}); st != http.StatusOK || body != "hello from the sandbox\n" {
		t.Errorf("by host name: %d %q", st, body)
	}
	if st, _ := portGet(t, "/hello.txt", map[string]string{"Host": host}); st != http.StatusForbidden {
		t.Errorf("by host name without a token: %d, want 403", st)
	}
	if st, body := portGet(t, "/health", map[string]string{"Host": "49983-" + id + "." + e2eDomain}); st != http.StatusNoContent {
		t.Errorf("envd by host name: %d %s", st, body)
	}
	// By forkbox's REST path, with the tenant's key only.
	st, _, rb := rawCall(t, env.key, "GET", "/v1/sessions/"+id+"/ports/8000/hello.txt", nil)
	if st != http.StatusOK || string(rb) != "hello from the sandbox\n" {
		t.Errorf("REST path: %d %q", st, rb)
	}
	if st, _, rb := rawCall(t, otherKey, "GET", "/v1/sessions/"+id+"/ports/8000/hello.txt", nil); st != http.StatusNotFound {
		t.Errorf("REST path, another tenant: %d %s", st, rb)
	}

	// A 3 MB download arrives whole.
	want := sh(t, id, "sha256sum /tmp/www/big.bin | cut -c1-64")
	if st, body := portGet(t, "/big.bin", hdr("8000", "E2b-Traffic-Access-Token", tok)); st != http.StatusOK || len(body) != 3000000 {
		t.Errorf("download: %d, %d bytes", st, len(body))
	} else if got := sha256Hex([]byte(body)); got != strings.TrimSpace(want) {
		t.Errorf("download: sha256 %s, want %s", got, want)
	}

	// A streamed body: the first line arrives before the server sends the
	// second (which waits for /tmp/go, made only after the first is read).
	t.Run("stream", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(ctxFor(t, time.Minute), "GET", env.d.URL+"/stream", nil)
		for k, v := range hdr("8001", "E2b-Traffic-Access-Token", tok) {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		first, err := br.ReadString('\n')
		if err != nil || first != "first\n" {
			t.Fatalf("first line: %q %v", first, err)
		}
		sh(t, id, "touch /tmp/go")
		rest, _ := io.ReadAll(br)
		if string(rest) != "second\n" {
			t.Fatalf("rest: %q", rest)
		}
	})

	// WebSocket echo, by headers and by host name.
	t.Run("websocket", func(t *testing.T) {
		u, _ := url.Parse(env.d.URL)
		for _, opts := range []*websocket.DialOptions{
			{HTTPHeader: http.Header{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"8001"}, "E2b-Traffic-Access-Token": {tok}}},
			{Host: "8001-" + id + "." + e2eDomain, HTTPHeader: http.Header{"E2b-Traffic-Access-Token": {tok}}},
		} {
			ctx := ctxFor(t, time.Minute)
			c, _, err := websocket.Dial(ctx, "ws://"+u.Host+"/ws", opts)
			if err != nil {
				t.Fatal(err)
			}
			c.SetReadLimit(1 << 20)
			for _, msg := range []string{"hello", strings.Repeat("x", 200000)} {
				if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
					t.Fatal(err)
				}
				typ, got, err := c.Read(ctx)
				if err != nil || typ != websocket.MessageText || string(got) != msg {
					t.Fatalf("echo of %d bytes: %v %d bytes %v", len(msg), typ, len(got), err)
				}
			}
			if err := c.Close(websocket.StatusNormalClosure, "done"); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})

	// Bad input.
	start := time.Now()
	if st, body := portGet(t, "/", hdr("8009", "E2b-Traffic-Access-Token", tok)); st != http.StatusBadGateway ||
		!strings.Contains(body, "nothing listens on port 8009") {
		t.Errorf("closed port: %d %s", st, body)
	}
	t.Logf("closed port answered in %v", time.Since(start))
	for _, p := range []string{"0", "70000", "abc", "-1"} {
		if st, body := portGet(t, "/", hdr(p, "E2b-Traffic-Access-Token", tok)); st != http.StatusBadRequest {
			t.Errorf("port %s: %d %s, want 400", p, st, body)
		}
		if st, _, rb := rawCall(t, env.key, "GET", "/v1/sessions/"+id+"/ports/"+p+"/", nil); st != http.StatusBadRequest {
			t.Errorf("REST port %s: %d %s, want 400", p, st, rb)
		}
	}
	if st, body := portGet(t, "/", map[string]string{"E2b-Sandbox-Id": "nosuchsandbox0000000", "E2b-Sandbox-Port": "8000"}); st != http.StatusNotFound {
		t.Errorf("unknown sandbox: %d %s", st, body)
	}
	if st, _, rb := rawCall(t, env.key, "GET", "/v1/sessions/"+id+"/ports/8009/", nil); st != http.StatusBadGateway ||
		problemType(rb) != "/problems/port-not-listening" {
		t.Errorf("REST closed port: %d %s", st, rb)
	}

	// One audit record per request.
	list, err := env.c.Audit(ctxFor(t, time.Minute), client.AuditFilter{Session: id, Kind: "port"})
	if err != nil || len(list.Records) < 8 {
		t.Errorf("port audit records: %v, %v", list, err)
	}

	// Paused: 409, and the request does not resume it.
	if st, b := e2bCall(t, "POST", "/sandboxes/"+id+"/pause", ""); st != http.StatusNoContent {
		t.Fatalf("pause: %d %s", st, b)
	}
	if st, body := portGet(t, "/hello.txt", hdr("8000", "E2b-Traffic-Access-Token", tok)); st != http.StatusConflict {
		t.Errorf("paused: %d %s, want 409", st, body)
	}
	if s, err := env.c.GetSession(ctxFor(t, time.Minute), id); err != nil || s.State != "paused" {
		t.Errorf("after a port request: %v %v", s, err)
	}
}

// sha256Hex is the hex SHA-256 of b.
func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestSandboxPortsPublic proves a sandbox created with
// network.allowPublicTraffic answers without any token, and keeps it
// in its view (forkbox's public_traffic).
func TestSandboxPortsPublic(t *testing.T) {
	need(t)
	sb := portCreate(t, `{"templateID":"base","timeout":300,"network":{"allowPublicTraffic":true}}`)
	startPortServers(t, sb)
	if st, body := portGet(t, "/hello.txt", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8000"}); st != http.StatusOK {
		t.Errorf("public, no token: %d %s", st, body)
	}
	if st, body := portGet(t, "/hello.txt", map[string]string{"Host": "8000-" + sb.SandboxID + "." + e2eDomain}); st != http.StatusOK {
		t.Errorf("public by host name, no token: %d %s", st, body)
	}
	ctx := ctxFor(t, 2*time.Minute)
	s, err := env.c.GetSession(ctx, sb.SandboxID)
	if err != nil || !s.PublicTraffic {
		t.Errorf("session view: %+v %v", s, err)
	}
	// Pause and resume keep it; so does a fork.
	if _, err := env.c.Pause(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	if s, err := env.c.Resume(ctx, sb.SandboxID); err != nil || !s.PublicTraffic {
		t.Errorf("after pause and resume: %+v %v", s, err)
	}
	fr, err := env.c.ForkSession(ctx, sb.SandboxID, client.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	child := fr.Sessions[0]
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = env.c.DeleteSession(ctx, child.ID)
		_ = env.c.DeleteSnapshot(ctx, fr.Snapshot.ID, true)
	})
	if !child.PublicTraffic {
		t.Errorf("the fork of a public sandbox is private: %+v", child)
	}
	// A private sandbox's fork stays private.
	priv := portCreate(t, `{"templateID":"base","timeout":300}`)
	fp, err := env.c.ForkSession(ctx, priv.SandboxID, client.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = env.c.DeleteSession(ctx, fp.Sessions[0].ID)
		_ = env.c.DeleteSnapshot(ctx, fp.Snapshot.ID, true)
	})
	if fp.Sessions[0].PublicTraffic {
		t.Errorf("the fork of a private sandbox is public")
	}
}

// portForward runs `forkbox port-forward ID 0:REMOTE` and returns the
// local address it listens on; it is stopped when the test ends.
func portForward(t *testing.T, id string, remote int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, env.cli, "port-forward", id, "0:"+strconv.Itoa(remote))
	cmd.Env = append(cmd.Environ(), "FORKBOX_URL="+env.d.URL, "FORKBOX_API_KEY="+env.key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("port-forward stderr: %s", stderr.String())
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	var addr string
	if _, scanErr := fmt.Sscanf(line, "Forwarding %s", &addr); err != nil || scanErr != nil {
		t.Fatalf("port-forward printed %q (%v); stderr %s", line, err, stderr.String())
	}
	return addr
}

// TestPortForward proves `forkbox port-forward` carries plain TCP (a
// half-close included) and HTTP to a sandbox without egress, and that the
// port path reaches only the sandbox's own loopback: a server on the
// host's 127.0.0.1, and one in another sandbox, are not reachable.
func TestPortForward(t *testing.T) {
	need(t)
	sb := portCreate(t, `{"templateID":"base","timeout":300}`)
	startPortServers(t, sb)

	tcp := portForward(t, sb.SandboxID, 8002)
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", tcp)
		if err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("ping %d %s", i, strings.Repeat("y", 100000))
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).CloseWrite()
		c.SetDeadline(time.Now().Add(time.Minute))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != "echo:"+msg {
			t.Fatalf("TCP through port-forward: %d bytes %v", len(got), err)
		}
	}
	web := portForward(t, sb.SandboxID, 8000)
	resp, err := http.Get("http://" + web + "/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello from the sandbox\n" {
		t.Errorf("HTTP through port-forward: %q", b)
	}

	// The host's loopback is not the sandbox's.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			io.WriteString(c, "HOST SECRET")
			c.Close()
		}
	}()
	hostPort := l.Addr().(*net.TCPAddr).Port
	var apiErr *client.Error
	if _, err := env.c.DialPort(ctxFor(t, time.Minute), sb.SandboxID, hostPort); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadGateway {
		t.Errorf("the host's port %d through the sandbox: %v, want 502", hostPort, err)
	}
	fwd := portForward(t, sb.SandboxID, hostPort)
	if c, err := net.Dial("tcp", fwd); err == nil {
		c.SetDeadline(time.Now().Add(time.Minute))
		got, _ := io.ReadAll(c)
		c.Close()
		if len(got) != 0 {
			t.Errorf("port-forward to the host's port read %q", got)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's listener accepted %d connections from the port path", n)
	}
	// Nor does another sandbox's port 8000 lead to this one's.
	other := portCreate(t, `{"templateID":"base","timeout":300}`)
	if st, body := portGet(t, "/hello.txt", map[string]string{"E2b-Sandbox-Id": other.SandboxID, "E2b-Sandbox-Port": "8000",
		"E2b-Traffic-Access-Token": other.TrafficAccessToken}); st != http.StatusBadGateway {
		t.Errorf("another sandbox's port 8000: %d %s, want 502", st, body)
	}
	// A sandbox's token opens only its own ports.
	if st, _ := portGet(t, "/hello.txt", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8000",
		"E2b-Traffic-Access-Token": other.TrafficAccessToken}); st != http.StatusForbidden {
		t.Errorf("another sandbox's token: %d, want 403", st)
	}
}
