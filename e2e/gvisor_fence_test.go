package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testnet"
	"github.com/forkbox/forkbox/netpolicy"
)

// gvisorHostProbe, run as root in a networked gVisor sandbox, tries TCP
// to each address given (host:port, IPv6 with a scope) and UDP to each,
// printing what each attempt gave.
const gvisorHostProbe = `
import json, socket, sys
res = {}
for a in sys.argv[1:]:
    host, port = a.rsplit(":", 1)
    host = host.strip("[]")
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        info = socket.getaddrinfo(host, int(port), fam, socket.SOCK_STREAM)[0]
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(info[4])
        s.sendall(b"x")
        res["tcp " + a] = "ok"
    except Exception as e:
        res["tcp " + a] = "err:" + type(e).__name__
    try:
        info = socket.getaddrinfo(host, int(port), fam, socket.SOCK_DGRAM)[0]
        u = socket.socket(fam, socket.SOCK_DGRAM)
        for _ in range(3):
            u.sendto(b"u", info[4])
        res["udp " + a] = "sent"
    except Exception as e:
        res["udp " + a] = "err:" + type(e).__name__
print(json.dumps(res))
`

// TestGVisorNoHostServices: root in a networked gVisor sandbox reaches no
// host service but the egress service: not a host listener on every
// address through its own gateway, another sandbox's gateway, the host's
// other addresses, loopback, nor the host side of its link over IPv6, by
// TCP or UDP.
func TestGVisorNoHostServices(t *testing.T) {
	needGVisor(t)
	var tcpHits, udpHits atomic.Int32
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tcpHits.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			udpHits.Add(1)
		}
	}()

	other := newSession(t, client.CreateRequest{Network: &client.Network{Allow: []string{"allowed.test:80"}}})
	g := newSession(t, client.CreateRequest{Isolation: "gvisor", Network: &client.Network{Allow: []string{"other.test:80"}}})
	targets := []string{gatewayOf(t, g.ID), gatewayOf(t, other.ID), "127.0.0.1"}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() || strings.HasPrefix(p.Addr().String(), "10.231.") {
			continue
		}
		targets = append(targets, p.Addr().String())
	}
	// The host side of the sandbox's link over IPv6 (link-local), when it
	// has an address there.
	if ifc, err := net.InterfaceByName(netpolicy.HostLinkName(g.ID)); err == nil {
		las, _ := ifc.Addrs()
		for _, a := range las {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is6() {
				targets = append(targets, "["+p.Addr().String()+"%eth0]")
			}
		}
	}
	argv := []string{"python3", "/tmp/probe.py"}
	for _, h := range targets {
		argv = append(argv, fmt.Sprintf("%s:%d", h, port))
	}
	putFile(t, g.ID, "/tmp/probe.py", gvisorHostProbe)
	res, out, errOut := run(t, g.ID, client.ExecRequest{User: "root", Argv: argv})
	if res.ExitCode != 0 {
		t.Fatalf("probe: exit %d\n%s\n%s", res.ExitCode, out, errOut)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe output: %v\n%s", err, out)
	}
	t.Logf("probe: %v", got)
	for k, v := range got {
		if strings.HasPrefix(k, "tcp ") && v == "ok" {
			t.Errorf("%s: connected", k)
		}
	}
	// (A bound wait for datagrams that must not come.)
	time.Sleep(2 * time.Second)
	if n := tcpHits.Load(); n != 0 {
		t.Errorf("the host listener accepted %d connections from the sandbox", n)
	}
	if n := udpHits.Load(); n != 0 {
		t.Errorf("the host UDP listener received %d datagrams from the sandbox", n)
	}
}

// gvisorRestartHost is the test host of TestGVisorEgressSurvivesRestart,
// which gvisor-a.test and gvisor-b.test name.
const gvisorRestartHost = "198.51.100.47"

func init() {
	for _, n := range []string{"gvisor-a.test", "gvisor-b.test"} {
		egressNames[n] = []netip.Addr{netip.MustParseAddr(gvisorRestartHost)}
	}
}

// TestGVisorEgressSurvivesRestart: a restarted daemon adopts a networked
// gVisor sandbox (its egress answers again), takes a memory snapshot of it
// and forks it with another allow-list, which the fork gets: what the
// source may reach it may not, and the reverse.
func TestGVisorEgressSurvivesRestart(t *testing.T) {
	needGVisor(t)
	host := testnet.NewHost(t, gvisorRestartHost)
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hi %s", r.Host) }))
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 5*time.Minute)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Isolation: "gvisor",
		Network: &client.Network{Allow: []string{"gvisor-a.test:80"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(id, name string) string {
		argv := []string{"python3", "-c", `import sys, urllib.request
try:
    print(urllib.request.urlopen("http://` + name + `/", timeout=10).read().decode())
except Exception as e:
    print("err:" + str(e))`}
		out, err := o.c.ExecCollect(ctx, id, client.ExecRequest{Argv: argv})
		if err != nil {
			t.Fatalf("exec in %s: %v", id, err)
		}
		return strings.TrimSpace(string(out.Stdout))
	}
	if out := fetch(s.ID, "gvisor-a.test"); out != "hi gvisor-a.test" {
		t.Fatalf("before the restart: %q", out)
	}
	o.restart(t, nil)
	if out := fetch(s.ID, "gvisor-a.test"); out != "hi gvisor-a.test" {
		t.Fatalf("after the restart: %q", out)
	}
	sn, err := o.c.SnapshotWith(ctx, s.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatalf("memory snapshot after the restart: %v", err)
	}
	if out := fetch(s.ID, "gvisor-a.test"); out != "hi gvisor-a.test" {
		t.Fatalf("source after the snapshot: %q", out)
	}
	res, err := o.c.ForkSnapshot(ctx, sn.ID, client.ForkRequest{Count: 1,
		CreateRequest: client.CreateRequest{Network: &client.Network{Allow: []string{"gvisor-b.test:80"}}}})
	if err != nil {
		t.Fatalf("fork with another allow-list: %v", err)
	}
	f := res.Sessions[0]
	if out := fetch(f.ID, "gvisor-b.test"); out != "hi gvisor-b.test" {
		t.Errorf("fork, its own allow-list: %q", out)
	}
	if out := fetch(f.ID, "gvisor-a.test"); !strings.HasPrefix(out, "err:") {
		t.Errorf("fork, its source's allow-list: %q, want a refusal", out)
	}
	if out := fetch(s.ID, "gvisor-b.test"); !strings.HasPrefix(out, "err:") {
		t.Errorf("source, the fork's allow-list: %q, want a refusal", out)
	}
}

// gvisorSpoofProbe, run as root in a networked gVisor sandbox, takes the
// address argv[1] (another sandbox's) as its own, as far as its network
// stack lets it, and sends from it an HTTP request for Host allowed.test
// to port 15080 of each gateway argv[2:], printing what each gave.
const gvisorSpoofProbe = `
import json, socket, subprocess, sys, http.client
res = {}
try:
    r = subprocess.run(["ip", "addr", "add", sys.argv[1] + "/32", "dev", "eth0"], capture_output=True, text=True)
    res["ip_addr_add"] = str(r.returncode) + ":" + r.stderr.strip()[:80]
except Exception as e:
    res["ip_addr_add"] = "err:" + type(e).__name__
for gw in sys.argv[2:]:
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND
        except OSError:
            pass
        s.bind((sys.argv[1], 0))
        s.settimeout(5)
        s.connect((gw, 15080))
        s.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
        res[gw] = "ok:" + s.recv(64).decode(errors="replace").split("\r\n")[0]
    except Exception as e:
        res[gw] = "err:" + type(e).__name__
print(json.dumps(res))
`

// TestGVisorSpoofedSource: root in a networked gVisor sandbox that tries
// to take another sandbox's address and send from it gets nothing
// through, on its own gateway or the other's. (Today gVisor refuses it
// first: no address may be added, none bound that is not the
// sandbox's; the host table's source check, which drops what a link
// sends from an address not routed through it, is behind that.)
func TestGVisorSpoofedSource(t *testing.T) {
	needGVisor(t)
	host := testnet.NewHost(t, gvisorRestartHost)
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") }))
	other := newSession(t, client.CreateRequest{Network: &client.Network{Allow: []string{"gvisor-a.test:80"}}})
	g := newSession(t, client.CreateRequest{Isolation: "gvisor", Network: &client.Network{Allow: []string{"gvisor-b.test:80"}}})
	otherGW := netip.MustParseAddr(gatewayOf(t, other.ID))
	otherAddr := otherGW.Next() // (a link's /30: gateway, then sandbox)
	putFile(t, g.ID, "/tmp/spoof.py", strings.ReplaceAll(gvisorSpoofProbe, "allowed.test", "gvisor-a.test"))
	res, out, errOut := run(t, g.ID, client.ExecRequest{User: "root",
		Argv: []string{"python3", "/tmp/spoof.py", otherAddr.String(), gatewayOf(t, g.ID), otherGW.String()}})
	if res.ExitCode != 0 {
		t.Fatalf("probe: exit %d\n%s\n%s", res.ExitCode, out, errOut)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe output: %v\n%s", err, out)
	}
	t.Logf("probe: %v", got)
	for k, v := range got {
		if k != "ip_addr_add" && strings.HasPrefix(v, "ok:") {
			t.Errorf("from %s to %s: %q, want nothing through", otherAddr, k, v)
		}
	}
}
