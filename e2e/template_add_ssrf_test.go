package e2e

import (
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
)

// addRedirectHost is the test host TestTemplateBuildAddURLBlocked's
// redirects come from (hop.test).
const addRedirectHost = "198.51.100.57"

func init() {
	egressNames["hop.test"] = []netip.Addr{netip.MustParseAddr(addRedirectHost)}
	egressNames["loop.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
}

// TestTemplateBuildAddURLBlocked proves the daemon's ADD downloads reach
// none of the addresses a sandbox may never reach, though the names are
// allowed: a name that resolves to loopback (where a server listens in
// the daemon's own network namespace) or to the metadata address, a
// redirect from an allowed host to a loopback literal or to such a
// name, and userinfo naming an allowed host before a loopback literal.
// Each is a 400, and the loopback server sees no request.
func TestTemplateBuildAddURLBlocked(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 10*time.Minute)
	var hits atomic.Int32
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintln(w, "secret")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	port := l.Addr().(*net.TCPAddr).Port
	host := testnet.NewHost(t, addRedirectHost)
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/to-literal":
			http.Redirect(w, r, fmt.Sprintf("http://127.0.0.1:%d/x", port), http.StatusFound)
		case "/to-name":
			http.Redirect(w, r, fmt.Sprintf("http://loop.test:%d/x", port), http.StatusFound)
		case "/to-metadata":
			http.Redirect(w, r, "http://rebind.test/latest/meta-data/", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	lp := fmt.Sprint(port)
	allow := []string{"hop.test:80", "loop.test:" + lp, "rebind.test:80", "127.0.0.1:" + lp}
	for doc, u := range map[string]string{
		"a name resolving to loopback":         "http://loop.test:" + lp + "/x",
		"a name resolving to metadata":         "http://rebind.test/latest/meta-data/",
		"a redirect to a loopback literal":     "http://hop.test/to-literal",
		"a redirect to a name of loopback":     "http://hop.test/to-name",
		"a redirect to a name of metadata":     "http://hop.test/to-metadata",
		"userinfo before a loopback literal":   "http://hop.test@127.0.0.1:" + lp + "/x",
		"a loopback literal in the allow-list": "http://127.0.0.1:" + lp + "/x",
	} {
		name := tplName("add-ssrf")
		deleteBuildSnapshotsAtEnd(t, env.c, name)
		_, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: "FROM base\nADD " + u + " /opt/f\n", Allow: allow}, client.BuildOptions{})
		t.Logf("%s: %v", doc, err)
		if problemStatus(err) != 400 || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s (%s): %v, want a 400 naming line 2", doc, u, err)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the loopback server got %d requests from the daemon's downloads", n)
	}
	wantNoPartials(t)
}
