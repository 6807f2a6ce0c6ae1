package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/broker"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testnet"
)

// The credential broker's test hosts: api.broker.test holds the secret's
// upstream, b.broker.test a second secret's (a host the first secret's
// placeholder must reach unreplaced).
const (
	brokerAPIHost = "198.51.100.44"
	brokerBHost   = "198.51.100.45"
)

// brokerUpstream is the test upstreams' own CA, which every test daemon
// trusts for the broker's upstream connections (daemon.Options
// .BrokerUpstreamCA, forkbox serve --broker-upstream-ca) and the sandboxes
// do not.
var brokerUpstream struct {
	once sync.Once
	ca   *broker.CA
	file string
	err  error
}

// brokerUpstreamCA returns the upstream CA and the PEM file that holds it
// (beside the shared data directory), made once.
func brokerUpstreamCA() (*broker.CA, string, error) {
	u := &brokerUpstream
	u.once.Do(func() {
		u.ca, u.err = broker.NewCA("e2e upstream", []string{"api.broker.test", "b.broker.test"})
		if u.err != nil {
			return
		}
		u.file = filepath.Join(filepath.Dir(env.dataDir), "broker-upstream-ca.pem")
		u.err = os.WriteFile(u.file, u.ca.PEM(), 0o644)
	})
	return u.ca, u.file, u.err
}

// headerLog records the headers each request to a test upstream carried,
// by path.
type headerLog struct {
	mu  sync.Mutex
	got map[string]http.Header
}

func (l *headerLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	l.got[r.Host+r.URL.Path] = r.Header.Clone()
	l.mu.Unlock()
	io.WriteString(w, "upstream ok")
}

func (l *headerLog) get(key string) http.Header {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.got[key]
}

// serveUpstream serves log over TLS (the upstream CA's leaf for the SNI
// asked) on 443 and over plain HTTP on 80 of host.
func serveUpstream(t *testing.T, host *testnet.Host, log *headerLog) {
	t.Helper()
	ca, _, err := brokerUpstreamCA()
	if err != nil {
		t.Fatal(err)
	}
	host.ServeHTTP(t, 80, log)
	l := tls.NewListener(host.Listen(t, 443), &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.Leaf(h.ServerName)
	}})
	srv := &http.Server{Handler: log}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// brokerProbe runs in the sandbox: requests carrying the placeholder in
// $APIKEY (or $PH when set), through the proxy (HTTPS_PROXY: CONNECT) and
// as transparent TLS, trusting only the sandbox's trust store.
const brokerProbe = `
import json, os, socket, ssl, sys, urllib.request, urllib.error
ph = os.environ.get("PH") or os.environ["APIKEY"]
tag = sys.argv[1]
def get(url, hdrs):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=hdrs), timeout=20) as r:
            return "ok:%d" % r.status
    except urllib.error.HTTPError as e:
        return "http:%d:%s" % (e.code, e.read().decode()[:200])
    except Exception as e:
        return "err:%s:%s" % (type(e).__name__, str(e)[:200])
def transparent():
    s = ssl.create_default_context().wrap_socket(socket.create_connection(("198.51.100.44", 443), timeout=20), server_hostname="api.broker.test")
    s.sendall(("GET /%s/t HTTP/1.1\r\nHost: api.broker.test\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % (tag, ph)).encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    return data.split(b"\r\n")[0].decode()
res = {"api": get("https://api.broker.test/%s/x" % tag, {"Authorization": "Bearer " + ph})}
if len(sys.argv) > 2:
    res["b"] = get("https://b.broker.test/%s/y" % tag, {"X-Leak": ph})
    res["plain_api"] = get("http://api.broker.test/%s/z" % tag, {"Authorization": "Bearer " + ph})
    res["plain_b"] = get("http://b.broker.test/%s/p" % tag, {"X-Leak": ph})
    try:
        res["transparent"] = transparent()
    except Exception as e:
        res["transparent"] = "err:%s:%s" % (type(e).__name__, str(e)[:200])
print(json.dumps(res))
`

// probeBroker runs brokerProbe in session id (with PH set when ph is not
// empty) and returns its results.
func probeBroker(t *testing.T, id, tag, ph string, all bool) map[string]string {
	t.Helper()
	argv := []string{"python3", "/tmp/broker_probe.py", tag}
	if all {
		argv = append(argv, "all")
	}
	req := client.ExecRequest{Argv: argv, TimeoutS: 120}
	if ph != "" {
		req.Env = map[string]string{"PH": ph}
	}
	res, out, errOut := run(t, id, req)
	if res.ExitCode != 0 {
		t.Fatalf("probe in %s: exit %d\n%s\n%s", id, res.ExitCode, out, errOut)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe output: %v\n%s", err, out)
	}
	t.Logf("probe %s in %s: %v", tag, id, got)
	return got
}

// placeholderOf returns the placeholder session id's environment holds.
func placeholderOf(t *testing.T, id string) string {
	t.Helper()
	_, out, _ := run(t, id, client.ExecRequest{Argv: []string{"printenv", "APIKEY"}})
	ph := strings.TrimSpace(out)
	if !strings.HasPrefix(ph, "fbx_apikey_") {
		t.Fatalf("APIKEY in %s is %q, want a placeholder", id, ph)
	}
	return ph
}

// assertValueAbsent fails t when value is in session id's files (its root
// filesystem as the host sees it) or in the environment or command line of
// any of its processes; control, which is in a process's environment (the
// placeholder), must be found, or the scan proves nothing.
func assertValueAbsent(t *testing.T, id string, value, control []byte) {
	t.Helper()
	root := hostPath(t, env.dataDir, id, "/")
	walked := 0
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err != nil || fi.Size() > 64<<20 {
			return nil
		}
		walked++
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, value) {
			t.Errorf("the secret's value is in the sandbox's file %s", strings.TrimPrefix(p, root))
		}
		return nil
	})
	if walked == 0 {
		t.Fatalf("no files under %s", root)
	}
	// A process with the session's environment, for the control.
	if _, err := env.c.ExecBackground(ctxFor(t, time.Minute), id, client.ExecRequest{Argv: []string{"sleep", "300"}}); err != nil {
		t.Fatal(err)
	}
	n, seen := 0, false
	for name, b := range sandboxProcFiles(t, id) {
		n++
		seen = seen || bytes.Contains(b, control)
		if bytes.Contains(b, value) {
			t.Errorf("the secret's value is in %s of a sandbox process", name)
		}
	}
	if n == 0 || !seen {
		t.Fatalf("read %d environments and command lines of sandbox processes, none with the placeholder", n)
	}
}

// sandboxProcFiles returns the environment and command line of every
// process of session id, by /proc path. In the runc tier they are read
// from the host (the sandbox's pids cgroup); in the gVisor tier, whose
// processes live in the Sentry, root inside reads them and sends them out
// whole (nothing of the test's secrets goes in).
func sandboxProcFiles(t *testing.T, id string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	s, err := env.c.GetSession(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	if s.Driver == "gvisor" {
		script := `import base64, glob, json
out = {}
for p in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        out[p] = base64.b64encode(open(p, "rb").read()).decode()
    except OSError:
        pass
print(json.dumps(out))`
		res, stdout, stderr := run(t, id, client.ExecRequest{User: "root", Argv: []string{"python3", "-c", script}})
		var enc map[string]string
		if res.ExitCode != 0 || json.Unmarshal([]byte(stdout), &enc) != nil {
			t.Fatalf("read /proc in the sandbox: exit %d %q %q", res.ExitCode, stdout, stderr)
		}
		for p, v := range enc {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				t.Fatal(err)
			}
			out[p] = b
		}
		return out
	}
	procs, err := os.ReadFile(cgroupFile(t, "pids", id, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range strings.Fields(string(procs)) {
		for _, f := range []string{"environ", "cmdline"} {
			p := filepath.Join("/proc", pid, f)
			if b, err := os.ReadFile(p); err == nil {
				out[p] = b
			}
		}
	}
	return out
}

// TestCredentialBroker: a session asks for a secret; its placeholder
// becomes the value only on the way to the secret's host over TLS (through
// the proxy and as transparent TLS), reaches another host unreplaced and
// recorded, is refused over plain HTTP; the value is never in the
// sandbox; forks get placeholders of their own that work only in them;
// removing the secret stops it at once.
func TestCredentialBroker(t *testing.T) {
	need(t)
	testCredentialBroker(t, "")
}

// TestGVisorCredentialBroker is TestCredentialBroker in the gVisor tier
// (its traffic reaches the same proxy through the host table's redirects).
func TestGVisorCredentialBroker(t *testing.T) {
	needGVisor(t)
	testCredentialBroker(t, "gvisor")
}

// testCredentialBroker runs TestCredentialBroker's checks on sessions of
// isolation ("" the default tier).
func testCredentialBroker(t *testing.T, isolation string) {
	apiLog := &headerLog{got: map[string]http.Header{}}
	bLog := &headerLog{got: map[string]http.Header{}}
	serveUpstream(t, testnet.NewHost(t, brokerAPIHost), apiLog)
	serveUpstream(t, testnet.NewHost(t, brokerBHost), bLog)

	rnd := make([]byte, 16)
	rand.Read(rnd)
	value := []byte("sk-e2e-" + hex.EncodeToString(rnd))
	rand.Read(rnd)
	other := []byte("other-e2e-" + hex.EncodeToString(rnd))
	ctx := ctxFor(t, 5*time.Minute)
	if _, created, err := env.c.SetSecret(ctx, "apikey", []string{"api.broker.test"}, "", value); err != nil || !created {
		t.Fatalf("set apikey: %v %v", created, err)
	}
	t.Cleanup(func() { env.c.DeleteSecret(ctxFor(t, time.Minute), "apikey") })
	if _, _, err := env.c.SetSecret(ctx, "other", []string{"b.broker.test"}, "X-Other: v={value}", other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.c.DeleteSecret(ctxFor(t, time.Minute), "other") })

	s := newSession(t, client.CreateRequest{Isolation: isolation, Secrets: []string{"apikey", "other"}, Network: &client.Network{
		Allow: []string{"api.broker.test:443", "api.broker.test:80", "b.broker.test:443", "b.broker.test:80"}}})
	if len(s.Secrets) != 2 {
		t.Fatalf("session secrets: %v", s.Secrets)
	}
	if _, err := env.c.Upload(ctx, s.ID, "/tmp/broker_probe.py", strings.NewReader(brokerProbe), int64(len(brokerProbe)), ""); err != nil {
		t.Fatal(err)
	}
	ph := placeholderOf(t, s.ID)
	got := probeBroker(t, s.ID, "parent", "", true)
	want := map[string]string{"api": "ok:200", "b": "ok:200", "plain_api": "http:403", "plain_b": "ok:200",
		"transparent": "HTTP/1.1 200"}
	for k, w := range want {
		if !strings.HasPrefix(got[k], w) {
			t.Errorf("%s: %q, want %q...", k, got[k], w)
		}
	}
	if h := apiLog.get("api.broker.test/parent/x"); h.Get("Authorization") != "Bearer "+string(value) {
		t.Errorf("through the proxy the upstream got Authorization %q", h.Get("Authorization"))
	}
	if h := apiLog.get("api.broker.test/parent/t"); h.Get("Authorization") != "Bearer "+string(value) {
		t.Errorf("by transparent TLS the upstream got Authorization %q", h.Get("Authorization"))
	}
	if h := bLog.get("b.broker.test/parent/y"); h.Get("X-Leak") != ph || h.Get("X-Other") != "v="+string(other) {
		t.Errorf("the second host got X-Leak %q X-Other %q", h.Get("X-Leak"), h.Get("X-Other"))
	}
	if h := bLog.get("b.broker.test/parent/p"); h.Get("X-Leak") != ph {
		t.Errorf("plain HTTP to the second host: X-Leak %q", h.Get("X-Leak"))
	}
	if apiLog.get("api.broker.test/parent/z") != nil {
		t.Error("a placeholder over plain HTTP reached the secret's host")
	}
	assertValueAbsent(t, s.ID, value, []byte(ph))
	assertValueAbsent(t, s.ID, other, []byte(ph))

	// The audit trail: a use, and the stray placeholder, by name and host.
	waitAudit(t, s.ID, func(recs []client.AuditRecord) bool {
		use, stray, plain := false, false, false
		for _, r := range recs {
			if strings.Contains(string(mustJSON(r.Detail)), string(value)) {
				t.Fatalf("an audit record holds the value: %+v", r)
			}
			use = use || (r.Kind == broker.KindUse && r.Detail["name"] == "apikey" && r.Detail["host"] == "api.broker.test")
			stray = stray || (r.Kind == broker.KindRefused && r.Detail["name"] == "apikey" && r.Detail["host"] == "b.broker.test")
			plain = plain || (r.Kind == broker.KindRefused && r.Detail["name"] == "apikey" && r.Detail["host"] == "api.broker.test")
		}
		return use && stray && plain
	})

	// Forks: placeholders of their own, each working only in its fork.
	fr, err := env.c.ForkSession(ctx, s.ID, client.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fr.Sessions {
		t.Cleanup(func() { env.c.DeleteSession(ctxFor(t, time.Minute), f.ID) })
	}
	a, b := fr.Sessions[0].ID, fr.Sessions[1].ID
	pa, pb := placeholderOf(t, a), placeholderOf(t, b)
	if pa == pb || pa == ph || pb == ph {
		t.Fatalf("placeholders: parent %s, forks %s %s", ph, pa, pb)
	}
	if r := probeBroker(t, a, "forka", "", false); r["api"] != "ok:200" {
		t.Fatalf("fork's own placeholder: %v", r)
	}
	if h := apiLog.get("api.broker.test/forka/x"); h.Get("Authorization") != "Bearer "+string(value) {
		t.Errorf("fork a's own placeholder reached the upstream as %q", h.Get("Authorization"))
	}
	for _, c := range []struct{ tag, ph string }{{"forka-b", pb}, {"forka-parent", ph}} {
		probeBroker(t, a, c.tag, c.ph, false)
		if h := apiLog.get("api.broker.test/" + c.tag + "/x"); h.Get("Authorization") != "Bearer "+c.ph {
			t.Errorf("%s: another session's placeholder reached the upstream as %q", c.tag, h.Get("Authorization"))
		}
	}

	// Removed: refused at once, in the fork and the parent.
	if err := env.c.DeleteSecret(ctx, "apikey"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{b, s.ID} {
		r := probeBroker(t, id, "revoked-"+id, "", false)
		if !strings.HasPrefix(r["api"], "http:403") || !strings.Contains(r["api"], "apikey") {
			t.Errorf("after secret rm in %s: %q", id, r["api"])
		}
		if apiLog.get("api.broker.test/revoked-"+id+"/x") != nil {
			t.Errorf("after secret rm a request from %s reached the upstream", id)
		}
	}
}

// mustJSON is v as JSON.
func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// waitAudit polls session id's broker audit records until done says they
// are all there (they are written as the broker sees each request).
func waitAudit(t *testing.T, id string, done func([]client.AuditRecord) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := env.c.Audit(ctxFor(t, time.Minute), client.AuditFilter{Session: id, Kind: "secret.", Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if done(l.Records) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker audit records of %s incomplete: %+v", id, l.Records)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
