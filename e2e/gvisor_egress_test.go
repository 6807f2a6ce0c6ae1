package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testnet"
)

// gatewayHTTPProbe prints the status of an HTTP request for Host
// allowed.test sent straight to port 15080 (the egress service's HTTP
// listener, netpolicy's listenHTTPPort) of the gateway argv[1], or the
// error's type.
const gatewayHTTPProbe = `
import http.client, sys
try:
    c = http.client.HTTPConnection(sys.argv[1], 15080, timeout=10)
    c.request("GET", "/", headers={"Host": "allowed.test"})
    print("ok:" + str(c.getresponse().status))
except Exception as e:
    print("err:" + type(e).__name__)
`

// putFile writes content to path in session id.
func putFile(t *testing.T, id, path, content string) {
	t.Helper()
	if _, err := env.c.Upload(ctxFor(t, time.Minute), id, path, strings.NewReader(content), int64(len(content)), ""); err != nil {
		t.Fatalf("upload %s to %s: %v", path, id, err)
	}
}

// gatewayOf returns the gateway (and resolver) address of session id.
func gatewayOf(t *testing.T, id string) string {
	t.Helper()
	f := strings.Fields(sh(t, id, "cat /etc/resolv.conf"))
	for i, w := range f {
		if w == "nameserver" && i+1 < len(f) {
			return f[i+1]
		}
	}
	t.Fatalf("no nameserver in %s's resolv.conf: %q", id, f)
	return ""
}

// TestGVisorEgressOwnGatewayOnly: a gVisor sandbox, whose network stack
// the rules of its namespace do not fence, reaches the egress service on
// its own gateway only. Addressed to another sandbox's gateway, the
// request that sandbox's policy allows is refused; on its own gateway it
// meets its own policy, which does not allow it.
func TestGVisorEgressOwnGatewayOnly(t *testing.T) {
	needGVisor(t)
	host := testnet.NewHost(t, egressHost)
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") }))
	other := newSession(t, client.CreateRequest{Network: &client.Network{Allow: []string{"allowed.test:80"}}})
	g := newSession(t, client.CreateRequest{Isolation: "gvisor", Network: &client.Network{Allow: []string{"other.test:80"}}})
	putFile(t, g.ID, "/tmp/gw.py", gatewayHTTPProbe)
	otherGW, ownGW := gatewayOf(t, other.ID), gatewayOf(t, g.ID)
	if otherGW == ownGW {
		t.Fatalf("two sessions share gateway %s", ownGW)
	}
	if out := strings.TrimSpace(sh(t, g.ID, "python3 /tmp/gw.py "+otherGW)); out != "err:ConnectionRefusedError" {
		t.Errorf("another sandbox's gateway: %q, want a refusal", out)
	}
	if out := strings.TrimSpace(sh(t, g.ID, "python3 /tmp/gw.py "+ownGW)); out != "ok:403" {
		t.Errorf("its own gateway: %q, want its own policy's 403", out)
	}
	// The other sandbox's policy does allow it there.
	putFile(t, other.ID, "/tmp/gw.py", gatewayHTTPProbe)
	if out := strings.TrimSpace(sh(t, other.ID, "python3 /tmp/gw.py "+otherGW)); out != "ok:200" {
		t.Errorf("the other sandbox on its own gateway: %q, want 200", out)
	}
}

// TestGVisorNetworkedMemoryFork: a memory snapshot of a gVisor sandbox
// with a network restores into forks that each have their own link and
// address and reach what the allow-list allows, as the source still does
// (the host table drops what a link sends from another link's address, so
// a fork that kept its source's address would reach nothing).
func TestGVisorNetworkedMemoryFork(t *testing.T) {
	needGVisor(t)
	host := testnet.NewHost(t, egressHost)
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.Host) }))
	src := newSession(t, client.CreateRequest{Isolation: "gvisor", Network: &client.Network{Allow: []string{"allowed.test:80"}}})
	get := `python3 -c 'import urllib.request as u; print(u.urlopen("http://allowed.test/", timeout=10).read().decode())'`
	if out := sh(t, src.ID, get); !strings.Contains(out, "hello allowed.test") {
		t.Fatalf("source before the snapshot: %q", out)
	}
	// A connection open at the snapshot does not stop it (in a fork it is
	// dead: its peer is the source's egress service).
	background(t, src.ID, `python3 -c 'import socket, time; s = socket.create_connection(("allowed.test", 80)); open("/tmp/open", "w").write("1"); time.sleep(100000)'`)
	waitFor(t, func() bool {
		res, _, _ := run(t, src.ID, client.ExecRequest{Cmd: "test -s /tmp/open"})
		return res.ExitCode == 0
	})
	sn := memorySnapshot(t, src.ID)
	forks := forkAll(t, sn.ID, 2)
	gateways := map[string]string{gatewayOf(t, src.ID): src.ID}
	for _, f := range forks {
		if f.Network == nil || len(f.Network.Allow) != 1 {
			t.Errorf("fork %s network: %+v", f.ID, f.Network)
		}
		gw := gatewayOf(t, f.ID)
		if prev, ok := gateways[gw]; ok {
			t.Errorf("fork %s has the gateway of %s (%s)", f.ID, prev, gw)
		}
		gateways[gw] = f.ID
		if out := sh(t, f.ID, get); !strings.Contains(out, "hello allowed.test") {
			t.Errorf("fork %s: %q", f.ID, out)
		}
	}
	if out := sh(t, src.ID, get); !strings.Contains(out, "hello allowed.test") {
		t.Errorf("source after the snapshot: %q", out)
	}
}

// TestGVisorMemorySnapshotNetworkShape: a session restored from a memory
// snapshot has a network exactly when the snapshot's session had one (the
// checkpoint holds its network stack): asking for one on a snapshot taken
// without is a 400 naming network.
func TestGVisorMemorySnapshotNetworkShape(t *testing.T) {
	src := gvisorSession(t)
	sn := memorySnapshot(t, src.ID)
	_, err := env.c.ForkSnapshot(ctxFor(t, time.Minute), sn.ID, client.ForkRequest{Count: 1,
		CreateRequest: client.CreateRequest{Network: &client.Network{Allow: []string{"allowed.test:80"}}}})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 400 || ce.Field != "network" {
		t.Fatalf("fork with a network of a snapshot without one: %v, want a 400 naming network", err)
	}
}

// gvisorRawProbe, run as root in a gVisor sandbox with a network, tries
// what a network stack in the sandbox's own hands would allow: raw IP and
// packet sockets (to spoof addresses or skip the fence) and a UDP datagram
// straight to the test host.
const gvisorRawProbe = `
import json, socket
res = {}
def attempt(k, fn):
    try:
        res[k] = "ok:" + str(fn())
    except Exception as e:
        res[k] = "err:" + type(e).__name__
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(5):
        s.sendto(b"out", ("198.51.100.40", 9999))
    return "sent"
attempt("raw_ip", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
attempt("raw_udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("udp", udp)
print(json.dumps(res))
`

// TestHostileGVisorNetwork: root in a networked gVisor sandbox cannot
// open raw or packet sockets (no CAP_NET_RAW), and a UDP datagram it sends
// to a host the allow-list does not name (no egress path carries UDP but
// DNS to its gateway) never arrives there.
func TestHostileGVisorNetwork(t *testing.T) {
	needGVisor(t)
	host := testnet.NewHost(t, egressHost)
	pc, err := host.ListenUDP(9999)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	g := newSession(t, client.CreateRequest{Isolation: "gvisor", Network: &client.Network{Allow: []string{"other.test:80"}}})
	putFile(t, g.ID, "/tmp/raw.py", gvisorRawProbe)
	res, out, errOut := run(t, g.ID, client.ExecRequest{User: "root", Argv: []string{"python3", "/tmp/raw.py"}})
	if res.ExitCode != 0 {
		t.Fatalf("probe: exit %d\n%s\n%s", res.ExitCode, out, errOut)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe output: %v\n%s", err, out)
	}
	for k, want := range map[string]string{"raw_ip": "err:PermissionError", "raw_udp": "err:PermissionError",
		"packet": "err:PermissionError", "udp": "ok:sent"} {
		if got[k] != want {
			t.Errorf("%s: %q, want %q", k, got[k], want)
		}
	}
	// The datagrams were sent before the probe returned; anything that
	// got through would be queued on the socket by now. (A bound wait for
	// the absence of a packet, not a timing assertion.)
	_ = pc.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	if n, from, err := pc.ReadFrom(buf); err == nil {
		t.Errorf("the test host received %q from %v", buf[:n], from)
	}
}
