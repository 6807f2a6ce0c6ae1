package e2e

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/testnet"
	"github.com/forkbox/forkbox/netpolicy"
)

// egressHost is the address of the test "internet" host the egress tests
// make; egressNames is the daemon's resolver for sandbox egress, so that
// no name a test uses is ever looked up outside this machine.
const egressHost = "198.51.100.40"

// egressTestNetworks is where the test hosts live: a documentation range
// the blocklist refuses except to tests.
var egressTestNetworks = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}

var egressNames = netpolicy.MapResolver{
	"allowed.test": {netip.MustParseAddr(egressHost)},
	"other.test":   {netip.MustParseAddr(egressHost)},
	"rebind.test":  {netip.MustParseAddr("169.254.169.254")},
	"quota.test":   {netip.MustParseAddr("198.51.100.41")},
	"restart.test": {netip.MustParseAddr("198.51.100.42")},
	// The credential broker's upstreams (broker_test.go).
	"api.broker.test": {netip.MustParseAddr(brokerAPIHost)},
	"b.broker.test":   {netip.MustParseAddr(brokerBHost)},
}

// egressProbe runs inside the sandbox and prints one JSON object: what
// each attempt to reach the outside gave ("ok:<status>" or "err:<reason>").
const egressProbe = `
import json, socket, ssl, urllib.request, urllib.error, http.client, subprocess
res = {}
def attempt(name, fn):
    try:
        res[name] = "ok:" + str(fn())
    except urllib.error.HTTPError as e:
        res[name] = "http:" + str(e.code)
    except Exception as e:
        res[name] = "err:" + type(e).__name__ + ":" + str(e)[:120]
def get(url, **kw):
    with urllib.request.urlopen(url, timeout=10, **kw) as r:
        return r.status
ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
attempt("proxy_http_allowed", lambda: get("http://allowed.test/"))
attempt("proxy_http_other", lambda: get("http://other.test/"))
attempt("proxy_https_allowed", lambda: get("https://allowed.test/", context=ctx))
attempt("proxy_https_other", lambda: get("https://other.test/", context=ctx))
attempt("proxy_cidr", lambda: get("http://198.51.100.40:8080/"))
attempt("proxy_rebind", lambda: get("http://rebind.test/"))
def direct_http(host, port=80, hosthdr=None):
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", "/", headers={"Host": hosthdr or host})
    return c.getresponse().status
attempt("transparent_http_allowed", lambda: direct_http("allowed.test"))
attempt("transparent_http_other", lambda: direct_http("198.51.100.40", hosthdr="other.test"))
attempt("transparent_metadata", lambda: direct_http("169.254.169.254"))
def direct_tls(name):
    s = socket.create_connection(("198.51.100.40", 443), timeout=10)
    t = ctx.wrap_socket(s, server_hostname=name)
    t.sendall(b"GET / HTTP/1.1\r\nHost: " + name.encode() + b"\r\nConnection: close\r\n\r\n")
    return t.recv(12).decode()
attempt("transparent_tls_allowed", lambda: direct_tls("allowed.test"))
attempt("transparent_tls_other", lambda: direct_tls("other.test"))
def tcp(host, port):
    s = socket.create_connection((host, port), timeout=5)
    s.close()
    return "connected"
attempt("direct_8080", lambda: tcp("198.51.100.40", 8080))
attempt("direct_ssh", lambda: tcp("198.51.100.40", 22))
attempt("direct_smtp", lambda: tcp("198.51.100.40", 25))
attempt("gateway_ssh", lambda: tcp(open("/etc/resolv.conf").read().split()[1], 22))
attempt("dns_allowed", lambda: socket.getaddrinfo("allowed.test", 80, socket.AF_INET)[0][4][0])
attempt("dns_other", lambda: socket.getaddrinfo("other.test", 80, socket.AF_INET)[0][4][0])
def dns_elsewhere():
    q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07allowed\x04test\x00\x00\x01\x00\x01"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(q, ("198.51.100.40", 53))
    return len(s.recv(512))
attempt("dns_elsewhere", dns_elsewhere)
print(json.dumps(res))
`

func TestEgressAllowList(t *testing.T) {
	need(t)
	testEgressAllowList(t, "")
}

// TestGVisorEgressAllowList: the same fence, redirects, refusals and
// records for a sandbox whose network stack is gVisor's (its frames leave
// by the link without passing the rules of its namespace).
func TestGVisorEgressAllowList(t *testing.T) {
	needGVisor(t)
	testEgressAllowList(t, "gvisor")
}

// testEgressAllowList runs the allow-list probe in a session of isolation
// ("" the default tier) and checks what each attempt gave, that root in
// the sandbox cannot change its network, the records, and that nothing of
// the network outlives the session.
func testEgressAllowList(t *testing.T, isolation string) {
	host := testnet.NewHost(t, egressHost)
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.Host) })
	host.ServeHTTP(t, 80, hello)
	host.ServeHTTP(t, 8080, hello)
	host.ServeTLS(t, 443, hello, "allowed.test", "other.test")
	ssh := host.Listen(t, 22) // open, so that only the fence can refuse it
	defer ssh.Close()

	s := newSession(t, client.CreateRequest{Isolation: isolation, Network: &client.Network{
		Allow: []string{"allowed.test:80", "allowed.test:443", "rebind.test:80", "198.51.100.40/32:8080"}}})
	if s.Network == nil || len(s.Network.Allow) != 4 || s.Network.MaxEgressBytes == 0 {
		t.Fatalf("session network: %+v", s.Network)
	}
	ca := testnetCA(t, host)
	if _, err := env.c.Upload(ctxFor(t, time.Minute), s.ID, "/tmp/ca.pem", bytes.NewReader(ca), int64(len(ca)), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := env.c.Upload(ctxFor(t, time.Minute), s.ID, "/tmp/probe.py", strings.NewReader(egressProbe), int64(len(egressProbe)), ""); err != nil {
		t.Fatal(err)
	}
	res, out, errOut := run(t, s.ID, client.ExecRequest{Argv: []string{"python3", "/tmp/probe.py"}, TimeoutS: 120})
	if res.ExitCode != 0 {
		t.Fatalf("probe: exit %d\n%s\n%s", res.ExitCode, out, errOut)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe output: %v\n%s", err, out)
	}
	t.Logf("probe: %v", got)
	want := map[string]string{
		"proxy_http_allowed":       "ok:200",
		"proxy_http_other":         "http:403",
		"proxy_https_allowed":      "ok:200",
		"proxy_https_other":        "err:",
		"proxy_cidr":               "ok:200",
		"proxy_rebind":             "http:403",
		"transparent_http_allowed": "ok:200",
		"transparent_http_other":   "ok:403",
		"transparent_metadata":     "ok:403",
		"transparent_tls_allowed":  "ok:HTTP/1.1 200",
		"transparent_tls_other":    "err:",
		"direct_8080":              "err:ConnectionRefusedError",
		"direct_ssh":               "err:ConnectionRefusedError",
		"direct_smtp":              "err:ConnectionRefusedError",
		"gateway_ssh":              "err:ConnectionRefusedError",
		"dns_allowed":              "ok:" + egressHost,
		"dns_other":                "err:gaierror",
		"dns_elsewhere":            "err:",
	}
	for k, w := range want {
		if !strings.HasPrefix(got[k], w) {
			t.Errorf("%s: %q, want %q...", k, got[k], w)
		}
	}

	// Root in the sandbox cannot change its network.
	_, out, errOut = run(t, s.ID, client.ExecRequest{User: "root",
		Cmd: "ip link set eth0 down; echo link=$?; ip addr add 10.231.99.2/30 dev eth0; echo addr=$?; ip route del default; echo route=$?"})
	if !strings.Contains(out, "link=2") || !strings.Contains(out, "addr=2") || !strings.Contains(out, "route=2") {
		t.Errorf("root changed the sandbox's network:\n%s\n%s", out, errOut)
	}

	// The records: allowed with bytes, refusals with reasons, DNS. They
	// are written in batches: poll until every expected one is there.
	wantRecs := []struct{ kind, host, decision string }{
		{"http", "other.test", "deny"}, {"dns", "other.test", "deny"}, {"dns", "allowed.test", "allow"},
		{"tls", "allowed.test", "allow"}, {"tls", "other.test", "deny"}, {"http", "rebind.test", "deny"},
		{"connect", "allowed.test", "allow"}, {"connect", "other.test", "deny"},
	}
	missing := func(recs []client.EgressRecord) []string {
		var out []string
		for _, w := range wantRecs {
			found := false
			for _, r := range recs {
				found = found || (r.Kind == w.kind && r.Host == w.host && r.Decision == w.decision)
			}
			if !found {
				out = append(out, w.kind+" "+w.host+" "+w.decision)
			}
		}
		return out
	}
	recs := waitEgress(t, s.ID, missing)
	if m := missing(recs); len(m) > 0 {
		t.Errorf("records missing: %v (of %d records)", m, len(recs))
	}
	var up, down int64
	for _, r := range recs {
		if r.Host == "allowed.test" && r.Decision == "allow" && r.Kind != "dns" {
			up, down = up+r.BytesUp, down+r.BytesDown
			if r.Addr != egressHost {
				t.Errorf("allowed record with address %q", r.Addr)
			}
		}
	}
	if up == 0 || down == 0 {
		t.Errorf("no bytes recorded for allowed.test: %+v", recs)
	}
	u, err := env.c.Usage(ctxFor(t, time.Minute), s.ID)
	if err != nil || u.EgressBytes == 0 {
		t.Errorf("usage egress_bytes: %+v %v", u, err)
	}

	// After the session ends, its network is gone and its records stay.
	if err := env.c.DeleteSession(ctxFor(t, time.Minute), s.ID); err != nil {
		t.Fatal(err)
	}
	if out := runHost(t, "ip", "-o", "link"); strings.Contains(out, netpolicy.HostLinkName(s.ID)) {
		t.Errorf("the session's link outlived it:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(env.dataDir, "netns", s.ID)); !os.IsNotExist(err) {
		t.Errorf("the session's namespace file outlived it: %v", err)
	}
	if after, err := env.c.Egress(ctxFor(t, time.Minute), s.ID, 0, 1000); err != nil || len(after) < len(recs) {
		t.Errorf("records after the session ended: %d %v", len(after), err)
	}
}

// testnetCA returns the PEM of the certificate host serves on 443.
func testnetCA(t *testing.T, host *testnet.Host) []byte {
	t.Helper()
	cert := host.TLSCertificate()
	if cert == nil {
		t.Fatal("test host serves no TLS")
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// TestEgressQuota: past max_egress_bytes the connection is cut, later
// ones are refused with the reason, and both are recorded.
func TestEgressQuota(t *testing.T) {
	need(t)
	host := testnet.NewHost(t, "198.51.100.41")
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 4<<20))
	}))
	s := newSession(t, client.CreateRequest{Network: &client.Network{Allow: []string{"quota.test:80"}, MaxEgressBytes: 1 << 20}})
	script := `
import urllib.request
n = 0
try:
    with urllib.request.urlopen("http://quota.test/", timeout=10) as r:
        while True:
            b = r.read(65536)
            if not b: break
            n += len(b)
except Exception as e:
    print("first:", type(e).__name__)
print("read", n)
try:
    urllib.request.urlopen("http://quota.test/", timeout=10)
except Exception as e:
    print("second:", e)
`
	_, out, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"python3", "-c", script}, TimeoutS: 60})
	var n int
	for _, line := range strings.Split(out, "\n") {
		fmt.Sscanf(line, "read %d", &n)
	}
	if n >= 4<<20 || !strings.Contains(out, "second: HTTP Error 403") {
		t.Errorf("quota of 1 MiB: read %d bytes of 4 MiB; output:\n%s", n, out)
	}
	time.Sleep(500 * time.Millisecond)
	recs, err := env.c.Egress(ctxFor(t, time.Minute), s.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range recs {
		found = found || strings.Contains(r.Reason, "quota")
	}
	if !found {
		t.Errorf("no record names the quota: %+v", recs)
	}
}

// TestEgressBadRequests: a network that cannot be honoured is a 400 naming
// the field, and leaves nothing behind.
func TestEgressBadRequests(t *testing.T) {
	need(t)
	before, _ := os.ReadDir(filepath.Join(env.dataDir, "netns"))
	for field, n := range map[string]*client.Network{
		"network.allow":                      {},
		"network.allow[1]":                   {Allow: []string{"ok.test:443", "no-port.test"}},
		"network.max_egress_bytes":           {Allow: []string{"ok.test:443"}, MaxEgressBytes: -1},
		"network.max_connections_per_minute": {Allow: []string{"ok.test:443"}, MaxConnectionsPerMinute: 1 << 30},
	} {
		_, _, err := env.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Network: n}, "")
		var ce *client.Error
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%+v: %v, want a field error on %s", n, err, field)
		}
	}
	if after, _ := os.ReadDir(filepath.Join(env.dataDir, "netns")); len(after) != len(before) {
		t.Errorf("refused creates left network namespaces: %v, before %v", after, before)
	}
}

// TestEgressSurvivesRestart: a restarted daemon adopts a sandbox's network
// (its proxy answers again) and removes the network when the session ends.
func TestEgressSurvivesRestart(t *testing.T) {
	host := testnet.NewHost(t, "198.51.100.42")
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "still here") }))
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 2*time.Minute)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Network: &client.Network{Allow: []string{"restart.test:80"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	fetch := []string{"python3", "-c", `import urllib.request; print(urllib.request.urlopen("http://restart.test/", timeout=10).read().decode())`}
	if out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: fetch}); err != nil || string(out.Stdout) != "still here\n" {
		t.Fatalf("before the restart: %+v %v", out, err)
	}
	o.restart(t, nil)
	if out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: fetch}); err != nil || string(out.Stdout) != "still here\n" {
		t.Fatalf("after the restart: stdout %q stderr %q %v", out.Stdout, out.Stderr, err)
	}
	if err := o.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if after := runHost(t, "ip", "-o", "link"); strings.Contains(after, netpolicy.HostLinkName(s.ID)) {
		t.Errorf("the session's link outlived it:\n%s", after)
	}
}

// waitEgress reads session id's egress records until missing finds none
// missing (or 10 s pass: records are written in batches) and returns the
// last reading.
func waitEgress(t *testing.T, id string, missing func([]client.EgressRecord) []string) []client.EgressRecord {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		recs, err := env.c.Egress(ctxFor(t, time.Minute), id, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(missing(recs)) == 0 || time.Now().After(deadline) {
			return recs
		}
	}
}
